"""Shared pytest set-up: a real kube-apiserver (tests/kubeapi.py) loaded with the objects the recorded
transcripts were taken from, and the Machines tests make on it. pytest.ini puts the collection (through its ansible_collections
namespace, .lab/collections made by `make dev-collection`) and lab/ on the path."""

import asyncio
import contextlib
import copy
import functools
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO, ".lab", "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "converged", "hpc")
FIXTURES = os.path.join(REPO, "tests", "fixtures")
TRANSCRIPTS = os.path.normpath(os.path.join(REPO, "..", "shared", "k8s", "transcripts"))

if not os.path.isdir(os.path.join(LINK, "plugins")):
    pytest.exit("the collection is not at %s: run `make dev-collection` (make unit does)" % LINK, returncode=4)

import kubeapi  # noqa: E402
from kubeapi import (  # noqa: E402,F401  pylint: disable=unused-import
    ADMIN_TOKEN, AUTOSCALE_TOKEN, INVENTORY_TOKEN, JOIN_TOKEN, LIFECYCLE_TOKEN, MARKER_TOKEN, MOVE_TOKEN, READONLY_TOKEN, ROLES,
    ROLLOUT_TOKEN)

# ---- the real kube-apiserver tier (tests/kube, and every test that talks to an API server): with
# kube-apiserver and etcd in $KUBEBUILDER_ASSETS (make kube-assets), else skipped in one line
KUBE_ASSETS, KUBE_MISSING = kubeapi.assets()
if KUBE_MISSING:
    collect_ignore_glob = ["kube/test_*.py"]


def pytest_report_header(config):
    if KUBE_MISSING:
        return "real kube-apiserver tier skipped: %s (make kube-assets builds it)" \
            % KUBE_MISSING
    return "real kube-apiserver tier: $%s=%s" % (kubeapi.ASSETS_VARIABLE, KUBE_ASSETS)


@contextlib.contextmanager
def recorded(workdir, docs=None, **options):
    """A real kube-apiserver (KubeApiServer's options) holding the objects the recorded transcripts were
    taken from (namespaces metal3 and lab2, 10 Machines), or docs instead; stopped when the block ends."""
    server = kubeapi.KubeApiServer(workdir, **options)
    try:
        server.start()
        if docs is None:
            kubeapi.load_recorded(server.api())
        else:
            server.api().load(docs)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kube(tmp_path_factory):
    """One real kube-apiserver (etcd, the CRDs, RBAC) for the session, holding the recorded objects (read
    them, never change them; a test that writes takes a namespace of its own, kube_ns)."""
    with recorded(tmp_path_factory.mktemp("kube-apiserver")) as server:
        yield server


@pytest.fixture(scope="module")
def recorded_server(tmp_path_factory):
    """A kube-apiserver of the module's own holding only the recorded objects: for a test that lists every
    namespace, or restarts the server."""
    if KUBE_MISSING:
        pytest.skip("real kube-apiserver tier skipped: " + KUBE_MISSING)
    with recorded(tmp_path_factory.mktemp("recorded-apiserver")) as server:
        yield server


_namespaces = iter(range(1, 1 << 30))


@pytest.fixture
def kube_ns(kube):
    """A namespace of this test's own on the real server (namespaces are never deleted: no
    controller would finish it)."""
    name = "t%d" % next(_namespaces)
    kube.api().namespace(name)
    return name


def load_metal3(api, namespace):
    """The fixture's metal3 objects in namespace (8 Machines, their Metal3Machines and hosts, the
    MachineDeployments and MachineSets, the Cluster), as their controllers wrote them."""
    docs = [d for d in load_fixture("capi-hpc.yaml") if d["metadata"].get("namespace") == "metal3"]
    api.load(docs, namespace=namespace)
    return namespace


@functools.lru_cache(maxsize=None)
def _parsed(name):
    with open(os.path.join(FIXTURES, name)) as fh:
        docs = []
        for doc in yaml.load_all(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if doc and doc.get("kind") == "List":
                docs.extend(doc.get("items") or [])
            elif doc:
                docs.append(doc)
        return json.dumps(docs, default=str)


def load_fixture(name):
    """Fresh copies of the documents of a fixture file (parsed once per session)."""
    return json.loads(_parsed(name))


def objects_by_kind(name="capi-hpc.yaml"):
    out = {}
    for doc in load_fixture(name):
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.fixture
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_module(name, args, bindir, check_mode=False, **env):
    """Run the collection's module `name` as Ansible would (its arguments on stdin), with the stand-in
    commands in bindir first on PATH and env added to the environment; its JSON result."""
    args = dict(args)
    if check_mode:
        args["_ansible_check_mode"] = True
    environ = dict(os.environ, PATH=str(bindir) + os.pathsep + os.environ["PATH"], PYTHONPATH=COLLECTIONS, **env)
    proc = subprocess.run([sys.executable, "-m", "ansible_collections.converged.hpc.plugins.modules." + name],
                          input=json.dumps({"ANSIBLE_MODULE_ARGS": args}), capture_output=True, text=True,
                          env=environ, cwd=REPO, timeout=60, check=False)
    return json.loads(proc.stdout)


def ansible_env(**extra):
    env = dict(os.environ)
    env.update(ANSIBLE_COLLECTIONS_PATH=COLLECTIONS, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0", ANSIBLE_DEPRECATION_WARNINGS="0")
    for key in [k for k in env if k.startswith("K8S_AUTH_")] + ["KUBECONFIG"]:
        env.pop(key, None)
    env.update(extra)
    return env


# ---- Machines as Cluster API writes them (the event source's and the rulebook's tests)
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
CAPI_G, CAPI_V = "cluster.x-k8s.io", "v1beta2"


def a_machine(world, name, phase="Provisioned", node_type="compute"):
    """A Machine in world's namespace as Cluster API makes one (make_machine), with our hook."""
    return make_machine(world.api(), world.ns, name, phase=phase, node_type=node_type)


def set_phase(world, name, phase):
    return set_machine_phase(world.api(), world.ns, name, phase)


class Backend:
    """The real kube-apiserver as tests reach it: its URL, CA, tokens, kubeconfig files and K8S_AUTH_* variables."""

    def __init__(self, name, url, ca_cert=None, sim=None, server=None):
        self.name, self.url, self.ca_cert, self.sim, self.server = name, url, ca_cert, sim, server

    def api(self, token=ADMIN_TOKEN):
        return kubeapi.Api(self.url, token, self.ca_cert)

    def namespace(self):
        """A new namespace of the test's own."""
        name = "t%d" % next(_namespaces)
        self.api().namespace(name)
        return name

    def auth(self, token=ADMIN_TOKEN):
        """kubernetes.core's connection options for it (host, api_key, ca_cert)."""
        out = {"host": self.url, "api_key": token}
        if self.ca_cert:
            out["ca_cert"] = self.ca_cert
        return out

    def kubeconfig(self, path, token=ADMIN_TOKEN, context="backend"):
        """A kubeconfig file for it with one user holding token (its CA when it has one); its path."""
        cluster = {"server": self.url}
        if self.ca_cert:
            import base64
            with open(self.ca_cert, "rb") as fh:
                cluster["certificate-authority-data"] = base64.b64encode(fh.read()).decode()
        config = {"apiVersion": "v1", "kind": "Config", "current-context": context,
                  "clusters": [{"name": self.name, "cluster": cluster}],
                  "users": [{"name": "user-" + context, "user": {"token": token}}],
                  "contexts": [{"name": context, "context": {"cluster": self.name, "user": "user-" + context}}]}
        with open(path, "w") as fh:
            yaml.safe_dump(config, fh)
        return str(path)

    def auth_env(self, token=ADMIN_TOKEN):
        """The same as K8S_AUTH_* variables."""
        out = {"K8S_AUTH_HOST": self.url, "K8S_AUTH_API_KEY": token}
        if self.ca_cert:
            out["K8S_AUTH_SSL_CA_CERT"] = self.ca_cert
        return out


@pytest.fixture
def backend(request):
    """The session's real kube-apiserver (holding the objects the recorded lists were taken from), reached
    over HTTPS with its CA; skipped, as the whole tier is, without the binaries."""
    if KUBE_MISSING:
        pytest.skip("real kube-apiserver tier skipped: " + KUBE_MISSING)
    server = request.getfixturevalue("kube")
    return Backend("kube", server.url, server.ca_cert, server=server)


@pytest.fixture
def world(backend):
    """The real server, with a namespace of the test's own (backend.ns) for what the test writes."""
    backend.ns = backend.namespace()
    return backend


# ---- Machines through the API (either backend): valid objects, status through /status
def make_machine(api, namespace, name, phase="Provisioned", node_type="compute", hooked=True, labels=None,
                 cluster="hpc", address="127.0.0.1"):
    """A Machine as Cluster API makes one (a MachineDeployment's labels, our hook when hooked, its
    finalizer), then its status: phase and address (loopback: nothing is ever sent to it); the Machine
    as the server returns it."""
    template = next(d for d in load_fixture("capi-hpc.yaml")
                    if d["kind"] == "Machine" and d["metadata"]["name"] == "hpc-compute-7d9f8-abcde")
    obj = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
           "metadata": {"name": name, "namespace": namespace, "finalizers": ["machine.cluster.x-k8s.io"],
                        "labels": dict({"cluster.x-k8s.io/cluster-name": cluster, "node-type": node_type},
                                       **(labels or {})),
                        "annotations": {HOOK: "converged-hpc"} if hooked else {}},
           "spec": copy.deepcopy(template["spec"])}
    obj["spec"]["clusterName"] = cluster
    obj["spec"]["infrastructureRef"]["name"] = name
    if node_type is None:
        del obj["metadata"]["labels"]["node-type"]
    api.create(obj, "capi-controller-manager")
    return set_machine_phase(api, namespace, name, phase, [{"type": "InternalIP", "address": address}])


def set_machine_phase(api, namespace, name, phase, addresses=None):
    status = dict({"phase": phase}, **({"addresses": addresses} if addresses else {}))
    return api.patch(CAPI_G + "/" + CAPI_V, "machines", namespace, name, {"status": status}, sub="status")


# ---- the event source run in a thread, as ansible-rulebook runs it (its tests, on either backend)
class Collector:
    def __init__(self):
        self.events = []

    async def put(self, event):
        self.events.append(event)


def run_source(args, until, timeout=20):
    """Run the source in a thread's event loop until until(events) or the timeout; the events."""
    out = Collector()
    result = {}

    def runner():
        async def go():
            task = asyncio.ensure_future(_event_source().main(out, args))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not until(out.events) and not task.done():
                await asyncio.sleep(0.05)
            if task.done():
                result["error"] = task.exception()
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):  # the test reads result["error"]
                pass
        asyncio.run(go())

    thread = threading.Thread(target=runner)
    thread.start()
    return thread, out, result


def _event_source():
    """The event source module (imported once the collection loader's namespace is on the path)."""
    from ansible_collections.converged.hpc.extensions.eda.plugins.event_source import capi_machines
    return capi_machines


def reasons(events):
    return [(e["capi_machines"]["reasons"], [m["name"] for m in e["capi_machines"]["machines"]]) for e in events]
