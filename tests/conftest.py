"""Shared pytest set-up: a running simulator loaded with objects recorded from a
real kube-apiserver. pytest.ini puts the collection (through its ansible_collections
namespace, .lab/collections made by `make dev-collection`) and lab/ on the path."""

import copy
import functools
import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO, ".lab", "collections")
LINK = os.path.join(COLLECTIONS, "ansible_collections", "converged", "hpc")
FIXTURES = os.path.join(REPO, "tests", "fixtures")
TRANSCRIPTS = os.path.normpath(os.path.join(REPO, "..", "shared", "k8s", "transcripts"))

if not os.path.isdir(os.path.join(LINK, "plugins")):
    pytest.exit("the collection is not at %s: run `make dev-collection` (make unit does)" % LINK, returncode=4)

from capisim import Identity, Simulator, Store  # noqa: E402
from capisim.__main__ import READONLY_RULES  # noqa: E402

ADMIN_TOKEN = "admin-token-for-tests"
READONLY_TOKEN = "readonly-token-for-tests"


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


def start_sim(documents=(), resources=None):
    store = Store(resources) if resources is not None else Store()
    store.load(list(documents))
    tokens = {ADMIN_TOKEN: Identity("admin"), READONLY_TOKEN: Identity("machine-reader", READONLY_RULES)}
    return Simulator(store, tokens).start()


@pytest.fixture
def sim():
    server = start_sim(load_fixture("capi-hpc.yaml"))
    yield server
    server.stop()


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


def machines(sim):
    return sim.store.resource(CAPI_G, "machines")


def a_machine(sim, name, phase="Provisioned", node_type="compute", namespace="metal3"):
    template = next(d for d in load_fixture("capi-hpc.yaml") if d["kind"] == "Machine")
    obj = copy.deepcopy(template)
    obj["metadata"] = {"name": name, "namespace": namespace,
                       "labels": {"node-type": node_type, "cluster.x-k8s.io/cluster-name": "hpc"},
                       "annotations": {HOOK: "converged-hpc"}, "finalizers": ["machine.cluster.x-k8s.io"]}
    obj["status"] = {"phase": phase}
    obj.pop("apiVersion", None)
    obj["apiVersion"] = "%s/%s" % (CAPI_G, CAPI_V)
    created = sim.store.create(machines(sim), namespace, {k: v for k, v in obj.items() if k != "status"})
    set_phase(sim, name, phase, namespace)
    return created


def set_phase(sim, name, phase, namespace="metal3"):
    store = sim.store
    obj = copy.deepcopy(store.get(machines(sim), namespace, name))
    obj["status"] = dict(obj.get("status") or {}, phase=phase)
    store.update(machines(sim), namespace, name, obj, subresource="status")


@pytest.fixture
def world():
    """An empty simulator with the namespace the lab's Machines live in (metal3)."""
    sim = start_sim([])
    sim.store.create(sim.store.resource("", "namespaces"), None,
                     {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "metal3"}})
    yield sim
    sim.stop()


# ---- the simulator over HTTPS (a self-signed certificate for 127.0.0.1)
def self_signed(tmp_path, name):
    cert, key = tmp_path / (name + ".crt"), tmp_path / (name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=" + name, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture
def tls_sim(tmp_path):
    """The capi-hpc fixture served over HTTPS; its CA is tmp_path/capisim.crt."""
    store = Store()
    store.load(load_fixture("capi-hpc.yaml"))
    server = Simulator(store, {ADMIN_TOKEN: Identity("admin")}, tls=self_signed(tmp_path, "capisim")).start()
    yield server
    server.stop()
