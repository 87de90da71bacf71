"""A real kube-apiserver for tests, and one small HTTP client for it.

The envtest convention: `kube-apiserver` and `etcd` are found in the directory $KUBEBUILDER_ASSETS
(`make kube-assets` builds kube-apiserver and the controllers from their Go modules, kube-assets/, and
links them with Debian's etcd in .lab/kube-assets).
KubeApiServer starts etcd and the server on loopback (TLS from a CA made here, static bearer
tokens, RBAC), installs CRDs (by default the recorded ones of ../shared/k8s/crds) and waits until
they are served; stop() ends both. Alone, no controller runs: nothing garbage-collects, a finalizer
stays until a client removes it, a deleted namespace stays Terminating. Controllers(server) adds the
real Cluster API, CAPM3 and Bare Metal Operator (test mode) managers, with the CRDs of their own
versions (module_crds()).

    server = KubeApiServer(workdir).start()   # about 5 s on 2 cores
    api = server.api()                        # the admin's client; server.api(READONLY_TOKEN)
    api.load(documents, namespace="t1")      # objects created, then their status written
"""

import base64
import copy
import glob
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_K8S = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "k8s"))
CRDS = os.path.join(SHARED_K8S, "crds")
ASSETS_VARIABLE = "KUBEBUILDER_ASSETS"

ADMIN_TOKEN = "admin-token-for-tests"
READONLY_TOKEN = "readonly-token-for-tests"
# a token of a user that may do nothing at all (no role bound): 403 on every request but discovery
NOBODY_TOKEN = "nobody-token-for-tests"

# the role the read-only token has: Machines only, read only (as the recorded server's machine-reader)
READER_RULES = [{"apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["get", "list", "watch"]}]
# a token whose user may mark Machines and read a MachineDeployment's scale, but not change it
MARKER_TOKEN = "marker-token-for-tests"
MARKER_RULES = [{"apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"], "verbs": ["get", "list", "patch"]},
                {"apiGroups": ["cluster.x-k8s.io"], "resources": ["machinedeployments", "machinedeployments/scale"],
                 "verbs": ["get"]}]
# the collection's own roles (rbac/*.yml, what a site grants each part): a token each, with exactly that role
RBAC_DIR = os.path.normpath(os.path.join(HERE, "..", "rbac"))

# a CA as a real one is made (kubeadm's, an enterprise CA's): what Python 3.13's strict X.509 checks ask for
CA_EXTENSIONS = ("-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                 "-addext", "subjectKeyIdentifier=hash")
# a server certificate's extensions (openssl x509 -extfile), given its subjectAltName
SERVER_EXTENSIONS = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                     "extendedKeyUsage=serverAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
                     "subjectAltName=%s\n")
# a client certificate's (the aggregator's front-proxy client, KEDA's mutual TLS)
CLIENT_EXTENSIONS = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                     "extendedKeyUsage=clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")


def openssl_in(where, *args):
    subprocess.run(["openssl"] + list(args), cwd=where, check=True, capture_output=True)


def make_ca(where, name, cn):
    """A CA as a real one is made: NAME.crt and NAME.key in where."""
    openssl_in(where, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=" + cn,
               *CA_EXTENSIONS, "-keyout", name + ".key", "-out", name + ".crt")


def issue(where, ca, name, cn, san=None, client=False):
    """NAME.crt and NAME.key in where, signed by the CA ca (its ca.crt, ca.key): a server certificate for the
    subjectAltName san, a client one (client=True), or both (san and client)."""
    openssl_in(where, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=" + cn, "-keyout", name + ".key",
               "-out", name + ".csr")
    if san and client:
        ext = SERVER_EXTENSIONS.replace("serverAuth", "serverAuth,clientAuth") % san
    else:
        ext = SERVER_EXTENSIONS % san if san else CLIENT_EXTENSIONS
    with open(os.path.join(where, name + ".ext"), "w") as fh:
        fh.write(ext)
    openssl_in(where, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
               "-CAcreateserial", "-days", "2", "-extfile", name + ".ext", "-out", name + ".crt")


def collection_role(name):
    """The rules of the collection's ClusterRole converged-hpc-NAME (- for _), as rbac/NAME.yml ships them."""
    with open(os.path.join(RBAC_DIR, name + ".yml")) as fh:
        role = next(doc for doc in yaml.safe_load_all(fh) if doc and doc.get("kind") == "ClusterRole")
    assert role["metadata"]["name"] == "converged-hpc-" + name.replace("_", "-"), role["metadata"]["name"]
    return role["rules"]


# the inventory plugin's and the event source's token: rbac/inventory.yml
INVENTORY_TOKEN = "inventory-token-for-tests"
# the lifecycle playbooks' token: rbac/lifecycle.yml with rbac/inventory.yml (their inventory is the plugin)
LIFECYCLE_TOKEN = "lifecycle-token-for-tests"
# autoscale.yml's token: rbac/autoscale.yml with rbac/inventory.yml
AUTOSCALE_TOKEN = "autoscale-token-for-tests"
# join_at_boot.yml's token: rbac/join_at_boot.yml with rbac/inventory.yml
JOIN_TOKEN = "join-at-boot-token-for-tests"
# move.yml's and rebalance.yml's token: rbac/move.yml with the roles of what a move runs (rbac/inventory.yml,
# rbac/autoscale.yml), and rbac/workload_reader.yml (the workload cluster's reads; the tests' one server plays both)
MOVE_TOKEN = "move-token-for-tests"
# rollout.yml's token: rbac/rollout.yml with the roles of what a rollout runs (inventory, lifecycle, autoscale, move)
ROLLOUT_TOKEN = "rollout-token-for-tests"
# keda.yml's token: rbac/keda.yml with rbac/inventory.yml
KEDA_TOKEN = "keda-token-for-tests"
# user, group and rules of each token with a role (the admin is system:masters, nobody has none)
ROLES = {READONLY_TOKEN: ("machine-reader", "inventory-readers", READER_RULES),
         MARKER_TOKEN: ("marker", "markers", MARKER_RULES),
         INVENTORY_TOKEN: ("inventory-part", "inventory-parts", collection_role("inventory")),
         LIFECYCLE_TOKEN: ("lifecycle-part", "lifecycle-parts", collection_role("inventory") + collection_role("lifecycle")),
         AUTOSCALE_TOKEN: ("autoscale-part", "autoscale-parts", collection_role("inventory") + collection_role("autoscale")),
         JOIN_TOKEN: ("join-at-boot-part", "join-at-boot-parts", collection_role("inventory") + collection_role("join_at_boot")),
         MOVE_TOKEN: ("move-part", "move-parts", collection_role("inventory") + collection_role("autoscale")
                      + collection_role("move") + collection_role("workload_reader")),
         ROLLOUT_TOKEN: ("rollout-part", "rollout-parts", collection_role("inventory") + collection_role("lifecycle")
                         + collection_role("autoscale") + collection_role("move") + collection_role("rollout")),
         KEDA_TOKEN: ("keda-part", "keda-parts", collection_role("inventory") + collection_role("keda"))}


def assets():
    """The directory holding kube-apiserver and etcd, or None with the reason."""
    where = os.environ.get(ASSETS_VARIABLE)
    if not where:
        return None, "$%s is not set" % ASSETS_VARIABLE
    missing = [b for b in ("kube-apiserver", "etcd") if not os.access(os.path.join(where, b), os.X_OK)]
    if missing:
        return None, "$%s=%s has no %s" % (ASSETS_VARIABLE, where, " or ".join(missing))
    return where, None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiError(Exception):
    def __init__(self, status, body):
        self.status, self.body = status, body
        super().__init__("HTTP %s: %s" % (status, (body or {}).get("message") if isinstance(body, dict) else body))


class Api:
    """Plain HTTP(S) requests to a Kubernetes API with one bearer token (a test's own view of the server,
    apart from the collection's client)."""

    def __init__(self, url, token, ca_cert=None):
        self.url, self.token = url.rstrip("/"), token
        self.context = ssl.create_default_context(cafile=ca_cert) if url.startswith("https") else None

    def request(self, method, path, body=None, content_type="application/json", query=None, token=None,
                headers=None, raw=False):
        """(status, decoded body) of one request; body: a dict or list sent as JSON (a str as it is)."""
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        sent = {"Accept": "application/json"}
        token = self.token if token is None else token
        if token:
            sent["Authorization"] = "Bearer " + token
        data = None
        if body is not None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            sent["Content-Type"] = content_type
        sent.update(headers or {})
        req = urllib.request.Request(url, method=method, data=data, headers=sent)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, payload = err.code, err.read()
        if raw:
            return status, payload
        try:
            return status, json.loads(payload) if payload else None
        except ValueError:
            return status, payload.decode("utf-8", "replace")

    def ok(self, method, path, body=None, content_type="application/json", query=None, expect=(200, 201)):
        status, data = self.request(method, path, body, content_type, query)
        if status not in expect:
            raise ApiError(status, data)
        return data

    # ---- paths
    @staticmethod
    def path(api_version, plural, namespace=None, name=None, sub=None):
        base = "/api/v1" if api_version == "v1" else "/apis/" + api_version
        out = base + ("/namespaces/%s" % namespace if namespace else "") + "/" + plural
        return out + ("/" + name if name else "") + ("/" + sub if sub else "")

    def obj_path(self, obj, sub=None):
        meta = obj["metadata"]
        return self.path(obj["apiVersion"], plural_of(obj), meta.get("namespace"), meta["name"], sub)

    # ---- objects
    def get(self, api_version, plural, namespace, name):
        status, data = self.request("GET", self.path(api_version, plural, namespace, name))
        if status == 404:
            return None
        if status != 200:
            raise ApiError(status, data)
        return data

    def list(self, api_version, plural, namespace=None, **query):
        return self.ok("GET", self.path(api_version, plural, namespace), query=query or None)["items"]

    def create(self, obj, manager=None):
        meta = obj["metadata"]
        return self.ok("POST", self.path(obj["apiVersion"], plural_of(obj), meta.get("namespace")), obj,
                       query={"fieldManager": manager} if manager else None)

    def patch(self, api_version, plural, namespace, name, body, kind="merge", sub=None):
        ctype = {"merge": "application/merge-patch+json", "json": "application/json-patch+json",
                 "strategic": "application/strategic-merge-patch+json"}[kind]
        return self.ok("PATCH", self.path(api_version, plural, namespace, name, sub), body, ctype)

    def delete(self, api_version, plural, namespace, name):
        return self.ok("DELETE", self.path(api_version, plural, namespace, name), expect=(200, 202))

    def namespace(self, name):
        status, data = self.request("POST", "/api/v1/namespaces",
                                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if status not in (201, 409):
            raise ApiError(status, data)

    def load(self, documents, namespace=None):
        """Objects as a server returned them (fixtures, transcripts): created without what the server
        sets, by their controller's field manager, then their status written through /status, then
        deleted when they were being deleted (their finalizers keep them). namespace: put every
        namespaced object there instead."""
        made, namespaces = [], set()
        for doc in documents:
            obj = clean(doc, namespace)
            name = obj["metadata"]["name"] if obj["kind"] == "Namespace" else obj["metadata"].get("namespace")
            if name and name not in namespaces:
                self.namespace(name)
                namespaces.add(name)
            if obj["kind"] == "Namespace":
                continue
            status = obj.pop("status", None)
            manager = CONTROLLERS.get(obj["kind"])
            created = self.create(obj, manager)
            if status:
                created["status"] = status
                created = self.ok("PUT", self.obj_path(created, "status"), created,
                                  query={"fieldManager": manager} if manager else None)
            if doc.get("metadata", {}).get("deletionTimestamp"):
                self.delete(obj["apiVersion"], plural_of(obj), obj["metadata"].get("namespace"),
                            obj["metadata"]["name"])
            made.append(created)
        return made


PLURALS = {"BareMetalHost": "baremetalhosts", "Metal3Machine": "metal3machines", "Metal3Cluster": "metal3clusters",
           "Metal3MachineTemplate": "metal3machinetemplates", "Metal3DataTemplate": "metal3datatemplates",
           "Metal3Data": "metal3datas", "Machine": "machines", "MachineSet": "machinesets",
           "MachineDeployment": "machinedeployments", "MachinePool": "machinepools", "Cluster": "clusters",
           "Secret": "secrets", "ConfigMap": "configmaps", "Namespace": "namespaces", "Lease": "leases",
           "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings", "Role": "roles",
           "RoleBinding": "rolebindings", "CustomResourceDefinition": "customresourcedefinitions", "Node": "nodes",
           "Pod": "pods", "ServiceAccount": "serviceaccounts", "Service": "services", "APIService": "apiservices",
           "ScaledObject": "scaledobjects", "TriggerAuthentication": "triggerauthentications"}


# the field manager of each kind's controller (the recorded objects' managedFields name them)
CONTROLLERS = {"Machine": "capi-controller-manager", "MachineSet": "capi-controller-manager",
               "MachineDeployment": "capi-controller-manager", "MachinePool": "capi-controller-manager",
               "Cluster": "capi-controller-manager", "Metal3Machine": "capm3-controller-manager",
               "Metal3Cluster": "capm3-controller-manager", "BareMetalHost": "baremetal-operator"}


def api_from_kubeconfig(path):
    """An Api for a kubeconfig file's first cluster and user (a bearer token; its CA as a file path)."""
    with open(path) as fh:
        config = yaml.safe_load(fh)
    cluster = config["clusters"][0]["cluster"]
    return Api(cluster["server"], config["users"][0]["user"]["token"], cluster.get("certificate-authority"))


def plural_of(obj):
    return PLURALS[obj["kind"]]


def clean(doc, namespace=None):
    """An object as a client creates it: no uid, resourceVersion, managedFields and the like."""
    obj = copy.deepcopy(doc)
    meta = obj.setdefault("metadata", {})
    for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "deletionTimestamp",
                "deletionGracePeriodSeconds", "selfLink"):
        meta.pop(key, None)
    if namespace and meta.get("namespace"):
        meta["namespace"] = namespace
        # owners are in the namespace the fixture had: their uids are not this server's
        meta.pop("ownerReferences", None)
    return obj


TRANSCRIPTS = os.path.join(SHARED_K8S, "transcripts")


def _commented_documents(path):
    """(comment lines before it, document) for each YAML document of path."""
    out, comments, lines = [], [], []

    def flush():
        text = "\n".join(lines)
        doc = yaml.safe_load(text) if text.strip() else None
        out.append((list(comments), doc))

    pending = []
    for line in open(path).read().splitlines():
        if line.strip() == "---":
            if lines or comments:
                flush()
            comments, lines, pending = pending, [], []
        elif line.startswith("# "):
            pending.append(line[2:])
        else:
            lines.append(line)
    flush()  # comments after the last document name nothing
    return out


def load_recorded(api, transcripts=TRANSCRIPTS):
    """The objects the recorded transcripts were taken from, made as they were made: objects.yaml
    created through the version each names, then status-patches.yaml sent as its comments say (a
    status first sent to v1beta2 and refused is sent again through v1beta1, as recorded; the
    deleting Machine deleted, its finalizer keeping it), each write by its controller's field manager,
    so that their managedFields are the recorded ones too."""
    for _comments, doc in _commented_documents(os.path.join(transcripts, "objects.yaml")):
        if not doc:
            continue
        if doc["kind"] == "Namespace":
            api.namespace(doc["metadata"]["name"])
            continue
        meta = doc["metadata"]
        manager = CONTROLLERS.get(doc["kind"], "kubectl-create")
        status, body = api.request("POST", api.path(doc["apiVersion"], plural_of(doc), meta.get("namespace")), doc,
                                   query={"fieldManager": manager})
        if status != 201 and not (status == 409 and doc["kind"].startswith("ClusterRole")):
            raise ApiError(status, body)
    refused = set()
    for comments, doc in _commented_documents(os.path.join(transcripts, "status-patches.yaml")):
        for comment in comments:
            words = comment.split(" ; ")[0].split()
            if words[0] == "DELETE":
                plural, group = words[1].split(".", 1)
                namespace, name = words[2].split("/")
                api.ok("DELETE", "/apis/%s/%s/namespaces/%s/%s/%s" % (group, "v1beta2", namespace, plural, name),
                       expect=(200, 202))
            elif words[0] in ("PATCH", "RETRY"):
                if words[0] == "RETRY":
                    at = words.index("PATCH")
                    plural, version, group = words[at + 1].split(".", 2)
                    target = words[at + 2]
                else:
                    (group, version), plural, target = words[1].split("/", 1), words[2], words[3]
                namespace, name = target.split("/")
                path = "/apis/%s/%s/namespaces/%s/%s/%s/status" % (group, version, namespace, plural, name)
                manager = next((m for k, m in CONTROLLERS.items() if PLURALS[k] == plural), "kubectl-patch")
                status, body = api.request("PATCH", path, doc, "application/merge-patch+json",
                                           query={"fieldManager": manager})
                if status == 422 and words[0] == "PATCH":
                    refused.add((plural, target))
                elif status != 200:
                    raise ApiError(status, body)
                elif words[0] == "RETRY":
                    refused.discard((plural, target))
    if refused:
        raise RuntimeError("status patches refused and never sent again: %s" % sorted(refused))


def read_yaml(path):
    with open(path) as fh:
        docs = []
        for doc in yaml.safe_load_all(fh):
            if doc and doc.get("kind") == "List":
                docs.extend(doc.get("items") or [])
            elif doc:
                docs.append(doc)
        return docs


class KubeApiServer:
    """etcd and kube-apiserver from $KUBEBUILDER_ASSETS on loopback, the CRDs installed."""

    def __init__(self, workdir, assets_dir=None, crds=CRDS, port=None, admin_token=ADMIN_TOKEN,
                 test_users=True, audit=False, aggregation=False):
        """crds: a directory of CRD files, a list of them (each a directory, or (directory, labels) to
        label every CRD of it), or None. port: the secure port (a free one by default); admin_token: the
        system:masters user's (the lab gives its own); test_users: also the tests' users with their fixed
        tokens and roles (the lab has none of them). audit: keep the server's audit log of every request
        (requests() reads it). aggregation: the aggregation layer an extension API server (KEDA's metrics
        server) needs: a front-proxy CA and the client certificate the server proxies with, as kubeadm makes
        them, and the requestheader settings naming them."""
        self.workdir = str(workdir)
        self.port, self.admin_token, self.test_users = port, admin_token, test_users
        self.assets = assets_dir or assets()[0]
        self.crds = [crds] if isinstance(crds, str) else list(crds or [])
        self.audit_log = os.path.join(self.workdir, "audit.log") if audit else None
        self.aggregation = aggregation
        self.procs = []
        self.url = None
        self.ca_cert = os.path.join(self.workdir, "ca.crt")
        self.started_in = None

    # ---- start and stop
    def start(self, timeout=90):
        t0 = time.monotonic()
        os.makedirs(self.workdir, exist_ok=True)
        self._certificates()
        with open(os.path.join(self.workdir, "tokens.csv"), "w") as fh:
            os.fchmod(fh.fileno(), 0o600)
            fh.write('%s,admin,admin-uid,"system:masters"\n' % self.admin_token)
            if self.test_users:
                for token, (user, group, _rules) in sorted(ROLES.items()):
                    fh.write('%s,%s,%s-uid,"%s"\n' % (token, user, user, group))
                fh.write('%s,nobody,nobody-uid\n' % NOBODY_TOKEN)
        client, peer, port = free_port(), free_port(), self.port or free_port()
        etcd_url = self.etcd_url = "http://127.0.0.1:%d" % client
        self._spawn("etcd", [os.path.join(self.assets, "etcd"), "--data-dir", os.path.join(self.workdir, "etcd"),
                             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                             "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                             "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                             "--initial-cluster", "default=http://127.0.0.1:%d" % peer])
        self.url = "https://127.0.0.1:%d" % port
        w = self.workdir
        self._apiserver_argv = [
            os.path.join(self.assets, "kube-apiserver"), "--etcd-servers=" + etcd_url,
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=%d" % port,
            "--tls-cert-file=%s/server.crt" % w, "--tls-private-key-file=%s/server.key" % w,
            "--client-ca-file=%s/ca.crt" % w, "--service-account-key-file=%s/sa.pub" % w,
            "--service-account-signing-key-file=%s/sa.key" % w, "--service-account-issuer=" + self.url,
            "--token-auth-file=%s/tokens.csv" % w, "--authorization-mode=RBAC",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none"]
        if self.aggregation:
            self._apiserver_argv += [
                "--requestheader-client-ca-file=%s/front-proxy-ca.crt" % w,
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                "--proxy-client-cert-file=%s/front-proxy-client.crt" % w,
                "--proxy-client-key-file=%s/front-proxy-client.key" % w]
        if self.audit_log:
            with open(os.path.join(w, "audit-policy.yaml"), "w") as fh:
                yaml.safe_dump({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                                "rules": [{"level": "Metadata"}]}, fh)
            self._apiserver_argv += ["--audit-policy-file=%s/audit-policy.yaml" % w,
                                     "--audit-log-path=" + self.audit_log, "--audit-log-mode=blocking"]
        self._spawn("kube-apiserver", self._apiserver_argv)
        api = self.api()
        self._wait(lambda: api.request("GET", "/readyz")[1] == "ok", timeout, "/readyz")
        if self.test_users:
            self._rbac(api)
        self.install_crds(self.crds, timeout)
        self.started_in = time.monotonic() - t0
        return self

    def restart_apiserver(self, timeout=90):
        """Kill kube-apiserver and start it again on the same etcd (a crash, or a node rebooted): its watch
        cache starts again at the current resourceVersion, its clients' connections are cut."""
        proc = next(p for p in self.procs if os.path.basename(p.args[0]) == "kube-apiserver")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        self.procs.remove(proc)
        self._spawn("kube-apiserver", self._apiserver_argv)
        api = self.api()
        self._wait(lambda: api.request("GET", "/readyz")[1] == "ok", timeout, "/readyz")
        self._wait(lambda: api.request("GET", "/apis/cluster.x-k8s.io/v1beta2/machines", query={"limit": 1})[0] == 200,
                   timeout, "the Machines")

    def requests(self, user=None):
        """What the server was asked, from its audit log: (verb, path, query) of each request answered,
        in order (user: only that user's; the test users' names are in ROLES, the admin is "admin")."""
        out = []
        with open(self.audit_log) as fh:
            for line in fh:
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete" or (user and event["user"].get("username") != user):
                    continue
                url = urllib.parse.urlsplit(event["requestURI"])
                out.append((event["verb"], url.path, dict(urllib.parse.parse_qsl(url.query))))
        return out

    def answered(self, user):
        """What user was answered, from the audit log: (verb, API group, resource, code) of each request on a
        resource (discovery and other non-resource paths left out), in order; the resource with its
        subresource ("machinedeployments/scale")."""
        out = []
        with open(self.audit_log) as fh:
            for line in fh:
                event = json.loads(line)
                ref = event.get("objectRef")
                if event.get("stage") != "ResponseComplete" or event["user"].get("username") != user or not ref:
                    continue
                resource = ref["resource"] + ("/" + ref["subresource"] if ref.get("subresource") else "")
                out.append((event["verb"], ref.get("apiGroup", ""), resource,
                            (event.get("responseStatus") or {}).get("code")))
        return out

    def compact(self):
        """Compact etcd after a write (what kube-apiserver does every 5 minutes): every resourceVersion
        given so far and the continue tokens made at them are gone once the watch cache no longer holds
        them (restart_apiserver); the revision compacted at."""
        def post(path, body):
            req = urllib.request.Request(self.etcd_url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)
        # a write of a key of our own first: every resourceVersion handed out so far is then older than it
        revision = int(post("/v3/kv/put", {"key": "L3Rlc3RzL2NvbXBhY3Q=", "value": "MQ=="})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def stop(self):
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(3)  # kube-apiserver drains its watches first: nothing to keep here
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
        self.procs = []
        for fh in getattr(self, "_logs", []):
            fh.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _spawn(self, name, argv):
        log = open(os.path.join(self.workdir, name + ".log"), "wb")
        self._logs = getattr(self, "_logs", []) + [log]
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           cwd=self.workdir))

    def log_tail(self, name="kube-apiserver", lines=20):
        try:
            with open(os.path.join(self.workdir, name + ".log"), errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""

    def _wait(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    name = os.path.basename(proc.args[0])
                    raise RuntimeError("%s exited (%s) while waiting for %s:\n%s"
                                       % (name, proc.returncode, what, self.log_tail(name)))
            try:
                if predicate():
                    return
            except OSError:  # not listening yet
                pass
            time.sleep(0.2)
        raise RuntimeError("kube-apiserver: %s not ready in %d s:\n%s" % (what, timeout, self.log_tail()))

    def _certificates(self):
        w = self.workdir
        # as a real CA makes them (kubeadm's): Python 3.13 checks X.509 strictly and refuses a CA without
        # basicConstraints and keyUsage, a server certificate without subjectAltName
        make_ca(w, "ca", "converged-hpc-test-ca")
        issue(w, "ca", "server", "kube-apiserver", "IP:127.0.0.1,DNS:localhost")
        openssl_in(w, "genrsa", "-out", "sa.key", "2048")
        openssl_in(w, "rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        if self.aggregation:
            make_ca(w, "front-proxy-ca", "front-proxy-ca")
            issue(w, "front-proxy-ca", "front-proxy-client", "front-proxy-client")

    def _rbac(self, api):
        for _token, (user, group, rules) in sorted(ROLES.items()):
            # the reader's role has the recorded server's name (objects.yaml makes it too)
            name = "capi-machine-reader" if user == "machine-reader" else "converged-hpc-test-" + user
            api.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name}, "rules": rules})
            api.ok("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]})

    def install_crds(self, crds, timeout=90):
        """Install CRDs (as the constructor's crds) and wait until they are established and served."""
        api = self.api()
        names, served = [], []
        paths = []
        for entry in crds:
            where, labels = entry if isinstance(entry, tuple) else (entry, {})
            paths += [(path, labels) for path in sorted(glob.glob(os.path.join(where, "*.yaml")))]
        for path, labels in paths:
            for crd in read_yaml(path):
                crd["metadata"].setdefault("labels", {}).update(labels)
                api.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
                names.append(crd["metadata"]["name"])
                version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
                served.append(("/apis/%s/%s" % (crd["spec"]["group"], version), crd["spec"]["names"]["plural"]))

        def established():
            for name in names:
                crd = api.ok("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + name)
                if not any(c["type"] == "Established" and c["status"] == "True"
                           for c in (crd.get("status") or {}).get("conditions") or []):
                    return False
            for path, plural in served:  # discovery serves them, so lists answer
                status, body = api.request("GET", path)
                if status != 200 or plural not in {r["name"] for r in body["resources"]}:
                    return False
            return True

        self._wait(established, timeout, "the CRDs")

    # ---- clients
    def api(self, token=None):
        return Api(self.url, token or self.admin_token, self.ca_cert)

    def kubeconfig(self, path, token=None, context="envtest"):
        """A kubeconfig file for this server with one user holding token (the admin's by default); its path."""
        token = token or self.admin_token
        with open(self.ca_cert) as fh:
            ca = base64.b64encode(fh.read().encode()).decode()
        config = {"apiVersion": "v1", "kind": "Config", "current-context": context,
                  "clusters": [{"name": "envtest", "cluster": {"server": self.url, "certificate-authority-data": ca}}],
                  "users": [{"name": "user-" + context, "user": {"token": token}}],
                  "contexts": [{"name": context, "context": {"cluster": "envtest", "user": "user-" + context}}]}
        with open(path, "w") as fh:
            yaml.safe_dump(config, fh)
        os.chmod(path, 0o600)
        return str(path)


def module_crds(assets_dir=None):
    """The CRDs of the controllers' own module versions (kube-assets/build.sh copies them next to the
    binaries), as KubeApiServer(crds=...) takes them. CAPM3's CRDs get the labels its own kustomization
    gives them (as clusterctl installs them): the Cluster API contract each of its API versions
    implements (cluster.x-k8s.io/v1beta2: v1beta2), which Cluster API reads to know which status fields
    say a Metal3Cluster or Metal3Machine is provisioned."""
    crds = os.path.join(assets_dir or assets()[0], "crds")
    with open(os.path.join(crds, "capm3.kustomization.yaml")) as fh:
        labels = {}
        for entry in yaml.safe_load(fh).get("labels") or []:
            labels.update(entry.get("pairs") or {})
    return [os.path.join(crds, "cluster-api"), (os.path.join(crds, "capm3"), labels), os.path.join(crds, "bmo")]


class Controllers:
    """The real Cluster API core manager, CAPM3 and the Bare Metal Operator (--test-mode: no Ironic, its
    fixture provisioner walks every host through registering, inspecting, available, provisioning,
    provisioned, deprovisioning) against a KubeApiServer, on loopback. No webhooks are installed:
    Cluster API and CAPM3 serve theirs (a throwaway certificate, a free port) but nothing calls them,
    so a client writes what they would default (the cluster-name label, a rollout strategy)."""

    BINARIES = ("cluster-api-manager", "capm3-manager", "baremetal-operator")

    def __init__(self, server, workdir=None, sync_period=None):
        """sync_period: Cluster API's --sync-period in seconds (its default: 10 minutes). Cluster API
        watches a workload cluster's Nodes only once its control plane is initialized, which (without a
        control plane provider) is once a control plane Machine has its nodeRef: the first such Machine
        whose Node registers after it was Provisioned is looked at again only at the next resync."""
        self.server = server
        self.sync_period = sync_period
        self.workdir = str(workdir or os.path.join(server.workdir, "controllers"))
        self.procs = {}
        self.health = {}

    def start(self, timeout=120):
        w = self.workdir
        os.makedirs(os.path.join(w, "webhook"), exist_ok=True)
        kubeconfig = self.server.kubeconfig(os.path.join(w, "kubeconfig"), context="controllers")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", "/CN=webhooks", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
                        "-addext", "extendedKeyUsage=serverAuth", "-keyout", "webhook/tls.key", "-out", "webhook/tls.crt"],
                       cwd=w, check=True, capture_output=True)
        bin_dir = self.server.assets
        for name in self.BINARIES:
            health = free_port()
            self.health[name] = "http://127.0.0.1:%d/readyz" % health
            if name == "baremetal-operator":
                argv = ["--test-mode", "--webhook-port=0", "--metrics-addr=0"]
            else:
                argv = ["--diagnostics-address=0", "--webhook-port=%d" % free_port(),
                        "--webhook-cert-dir=" + os.path.join(w, "webhook")]
                if name == "cluster-api-manager" and self.sync_period:
                    argv.append("--sync-period=%ds" % self.sync_period)
            argv.append("--health-addr=127.0.0.1:%d" % health)
            log = open(os.path.join(w, name + ".log"), "ab")
            env = dict(os.environ, KUBECONFIG=kubeconfig, POD_NAMESPACE="default")
            self.procs[name] = (subprocess.Popen([os.path.join(bin_dir, name)] + argv, stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=w, env=env),
                                log)
        deadline = time.monotonic() + timeout
        for name in self.BINARIES:
            while not self._ready(name):
                proc = self.procs[name][0]
                if proc.poll() is not None:
                    raise RuntimeError("%s exited (%s) while starting:\n%s"
                                       % (name, proc.returncode, self.log_tail(name)))
                if time.monotonic() > deadline:
                    raise RuntimeError("%s: not ready in %d s:\n%s" % (name, timeout, self.log_tail(name)))
                time.sleep(0.3)
        return self

    def _ready(self, name):
        try:
            with urllib.request.urlopen(self.health[name], timeout=2) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self):
        for proc, log in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, log in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            log.close()
        self.procs = {}

    def log_tail(self, name, lines=20):
        try:
            with open(os.path.join(self.workdir, name + ".log"), errors="replace") as fh:
                return "".join(fh.readlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class Keda:
    """KEDA's operator and metrics server (the keda-adapter) and kube-controller-manager's HPA controller only
    (--controllers=horizontalpodautoscaling), as make kube-assets KEDA=1 builds them, against a KubeApiServer
    started with aggregation=True, on loopback: KEDA's CRDs, its namespace and the RBAC its own config/ grants,
    the operator and metrics server running with a token of their ServiceAccount (a TokenRequest, as a Pod's
    projected token); their certificates from a CA made here (what KEDA's cert rotation would make), the
    metrics server registered as the APIService v1beta1.external.metrics.k8s.io behind an ExternalName
    Service (the aggregator reaches it on loopback). kube-controller-manager runs as the admin."""

    BINARIES = ("kube-controller-manager", "keda-operator", "keda-adapter")
    SERVICE = "keda-metrics-apiserver"

    def __init__(self, server, workdir=None, hpa_sync_period=15):
        """hpa_sync_period: the HPA controller's period in seconds (its default, 15 s)."""
        self.server, self.hpa_sync_period = server, hpa_sync_period
        self.workdir = str(workdir or os.path.join(server.workdir, "keda"))
        self.procs = {}
        self.health = {}

    def start(self, timeout=120):
        server, w, bins = self.server, self.workdir, self.server.assets
        missing = [b for b in self.BINARIES + ("keda-crds", "keda-rbac") if not os.path.exists(os.path.join(bins, b))]
        if missing:
            raise RuntimeError("%s has no %s: make kube-assets KEDA=1 builds them" % (bins, ", ".join(missing)))
        certs = os.path.join(w, "certs")
        os.makedirs(certs, exist_ok=True)
        api = server.api()
        server.install_crds([os.path.join(bins, "keda-crds")], timeout)
        api.namespace("keda")
        for path in sorted(glob.glob(os.path.join(bins, "keda-rbac", "*.yaml"))):
            for doc in read_yaml(path):
                status, body = api.request("POST", api.path(doc["apiVersion"], plural_of(doc),
                                                            doc["metadata"].get("namespace")), doc)
                if status not in (201, 409):
                    raise ApiError(status, body)
        token = api.ok("POST", "/api/v1/namespaces/keda/serviceaccounts/keda-operator/token",
                       {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 86400}})["status"]["token"]
        keda_config = server.kubeconfig(os.path.join(w, "keda.kubeconfig"), token=token, context="keda")
        admin_config = server.kubeconfig(os.path.join(w, "admin.kubeconfig"), context="kcm")
        # one certificate for the operator's gRPC server, the metrics server's client of it and its serving
        make_ca(certs, "ca", "keda-test-ca")
        issue(certs, "ca", "tls", "keda", "DNS:%s.keda.svc,DNS:keda-operator.keda.svc.cluster.local,"
              "DNS:localhost,IP:127.0.0.1" % self.SERVICE, client=True)
        grpc, adapter = free_port(), free_port()
        env = dict(os.environ, KUBECONFIG=keda_config, WATCH_NAMESPACE="", POD_NAMESPACE="keda",
                   KEDA_CLUSTER_OBJECT_NAMESPACE="keda", OPERATOR_NAME="keda-operator")
        kcm_port, probe = free_port(), free_port()
        self.health = {"kube-controller-manager": "https://127.0.0.1:%d/healthz" % kcm_port,
                       "keda-operator": "http://127.0.0.1:%d/readyz" % probe}
        argvs = {
            "kube-controller-manager": [
                "--kubeconfig=" + admin_config, "--authentication-kubeconfig=" + admin_config,
                "--authorization-kubeconfig=" + admin_config, "--controllers=horizontalpodautoscaling",
                "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=%d" % kcm_port,
                "--cert-dir=" + os.path.join(w, "kcm"),
                "--horizontal-pod-autoscaler-sync-period=%ds" % self.hpa_sync_period],
            "keda-operator": [
                "--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=127.0.0.1:%d" % probe,
                "--metrics-service-bind-address=127.0.0.1:%d" % grpc, "--cert-dir=" + certs,
                "--enable-cert-rotation=false", "--enable-webhook-patching=false", "--ca-dir=" + certs],
            "keda-adapter": [
                "--secure-port=%d" % adapter, "--bind-address=127.0.0.1", "--cert-dir=" + certs,
                "--tls-cert-file=%s/tls.crt" % certs, "--tls-private-key-file=%s/tls.key" % certs,
                "--lister-kubeconfig=" + keda_config, "--authentication-kubeconfig=" + keda_config,
                "--authorization-kubeconfig=" + keda_config, "--metrics-service-address=127.0.0.1:%d" % grpc,
                "--port=%d" % free_port()]}
        for name in self.BINARIES:
            log = open(os.path.join(w, name + ".log"), "ab")
            self.procs[name] = (subprocess.Popen([os.path.join(bins, name)] + argvs[name], stdout=log,
                                                 stderr=subprocess.STDOUT, start_new_session=True, cwd=w,
                                                 env=env if name.startswith("keda") else dict(os.environ)), log)
        with open(os.path.join(certs, "ca.crt"), "rb") as fh:
            ca_bundle = base64.b64encode(fh.read()).decode()
        api.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": self.SERVICE, "namespace": "keda"},
                    "spec": {"type": "ExternalName", "externalName": "localhost",
                             "ports": [{"name": "https", "port": adapter}]}})
        api.create({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                    "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                    "spec": {"service": {"name": self.SERVICE, "namespace": "keda", "port": adapter},
                             "group": "external.metrics.k8s.io", "version": "v1beta1", "caBundle": ca_bundle,
                             "groupPriorityMinimum": 100, "versionPriority": 100}})
        deadline = time.monotonic() + timeout
        for name in self.BINARIES:
            while not self.ready(name):
                proc = self.procs[name][0]
                if proc.poll() is not None:
                    raise RuntimeError("%s exited (%s) while starting:\n%s"
                                       % (name, proc.returncode, self.log_tail(name)))
                if time.monotonic() > deadline:
                    raise RuntimeError("%s: not ready in %d s:\n%s" % (name, timeout, self.log_tail(name)))
                time.sleep(0.3)
        return self

    def ready(self, name):
        """kube-controller-manager and the operator by their health ports; the metrics server once the
        aggregator serves its API (its APIService Available)."""
        if name == "keda-adapter":
            service = self.server.api().get("apiregistration.k8s.io/v1", "apiservices", None,
                                            "v1beta1.external.metrics.k8s.io")
            return any(c["type"] == "Available" and c["status"] == "True"
                       for c in ((service or {}).get("status") or {}).get("conditions") or [])
        try:
            with urllib.request.urlopen(self.health[name], timeout=2,
                                        context=ssl._create_unverified_context()) as resp:
                return resp.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def external_metric(self, namespace, name, selector):
        """The external metrics API's values of metric name (KEDA's scaler metric, "s0-..."), through the
        aggregator, as the HPA controller asks for them."""
        return self.server.api().ok("GET", "/apis/external.metrics.k8s.io/v1beta1/namespaces/%s/%s"
                                    % (namespace, urllib.parse.quote(name, safe="")),
                                    query={"labelSelector": selector})["items"]

    stop = Controllers.stop
    log_tail = Controllers.log_tail
    __enter__ = Controllers.__enter__
    __exit__ = Controllers.__exit__


def serve(workdir):
    """A Kubernetes workload cluster's API for the lab (lab/lab.sh): the server started in workdir (no CRDs),
    its address, CA and an admin token written there (url, ca.crt, token, kubeconfig); runs until SIGTERM."""
    server = KubeApiServer(workdir, crds=None).start()
    # no controller-manager makes the namespace's default ServiceAccount, which a Pod needs to be admitted
    server.api().ok("POST", "/api/v1/namespaces/default/serviceaccounts",
                    {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    with open(os.path.join(workdir, "token"), "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(ADMIN_TOKEN + "\n")
    with open(os.path.join(workdir, "kubeconfig"), "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "workload",
                        "clusters": [{"name": "workload", "cluster": {"server": server.url,
                                                                      "certificate-authority": server.ca_cert}}],
                        "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
                        "contexts": [{"name": "workload", "context": {"cluster": "workload", "user": "admin"}}]}, fh)
    with open(os.path.join(workdir, "url"), "w") as fh:
        fh.write(server.url + "\n")  # last: its presence says the server is ready
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    while not stopped:
        time.sleep(0.5)
    server.stop()


if __name__ == "__main__":  # python3 tests/kubeapi.py serve DIR
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit("usage: python3 tests/kubeapi.py serve DIR")
