"""The lab's management cluster, real: etcd and kube-apiserver, the Cluster API core manager, CAPM3 and the
Bare Metal Operator (test mode: no Ironic) from $KUBEBUILDER_ASSETS (make kube-assets), on loopback.

    python3 lab/mgmt.py serve DIR --port PORT --token-file FILE [--objects FILE]... [--logs DIR]
            [--workload CLUSTER=KUBECONFIG]...
        start them (state in DIR), install the controllers' CRDs, write the objects a site writes (a
        YAML stream: lab/capi_objects.py), a `<cluster>-kubeconfig` Secret for each Cluster (the
        controllers reach the cluster's API through it: a Kubernetes cluster's own (--workload), else the
        management cluster's), then DIR/url
        (its presence says all is ready) and DIR/ca.crt; run until SIGTERM, then stop them all
    python3 lab/mgmt.py apply KUBECONFIG FILE
        create the objects of a YAML stream (e.g. hosts registered later)
    python3 lab/mgmt.py claimed KUBECONFIG [--prefix NAME]
        name, address and node type of each host claimed and provisioning or provisioned
    python3 lab/mgmt.py identity KUBECONFIG OUT [--namespace NS] [--name SA]
        the collection's own identity, as docs/rbac.md has a site make it: the management cluster's roles of
        rbac/, a ServiceAccount bound to each, a token for it (TokenRequest), written as the kubeconfig OUT
        (the playbooks', the inventory's and the event path's; the lab's own tools keep the admin's)

Logs: DIR/apiserver/{etcd,kube-apiserver}.log and DIR/controllers/<manager>.log, linked from --logs.
Nothing here plays a controller: what the controllers write, they write.
"""

import argparse
import base64
import os
import signal
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import kubeapi  # noqa: E402  pylint: disable=wrong-import-position


def read_stream(path):
    with open(path) as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def create_all(api, docs):
    """Create each object (its namespace first); one already there is left as it is."""
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        if namespace:
            api.namespace(namespace)
        status, body = api.request("POST", api.path(doc["apiVersion"], kubeapi.plural_of(doc), namespace), doc)
        if status not in (201, 409):
            raise kubeapi.ApiError(status, body)


def workload_api(kubeconfig):
    """(server URL, CA certificate (base64), token) of a kubeconfig's first cluster and user."""
    with open(kubeconfig) as fh:
        config = yaml.safe_load(fh)
    cluster = config["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data")
    if not ca:
        with open(cluster["certificate-authority"], "rb") as fh:
            ca = base64.b64encode(fh.read()).decode()
    return cluster["server"], ca, config["users"][0]["user"]["token"]


def cluster_kubeconfig_secrets(server, docs, workloads=None):
    """What a site's bootstrap writes for each workload cluster: <cluster>-kubeconfig (key value). Cluster
    API's cluster cache and CAPM3 connect through it: to the cluster's own API when workloads names one
    ({cluster: kubeconfig file}: a Kubernetes cluster, whose Nodes Cluster API follows and drains); a Slurm
    cluster has no Kubernetes API of its own, so it names the management cluster's (no Node ever registers
    there for a Slurm host)."""
    out = []
    for doc in docs:
        if doc["kind"] != "Cluster":
            continue
        name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
        if name in (workloads or {}):
            url, ca, token = workload_api(workloads[name])
        else:
            with open(server.ca_cert, "rb") as fh:
                url, ca, token = server.url, base64.b64encode(fh.read()).decode(), server.admin_token
        config = {"apiVersion": "v1", "kind": "Config", "current-context": name,
                  "clusters": [{"name": name, "cluster": {"server": url, "certificate-authority-data": ca}}],
                  "users": [{"name": name + "-admin", "user": {"token": token}}],
                  "contexts": [{"name": name, "context": {"cluster": name, "user": name + "-admin"}}]}
        out.append({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                    "metadata": {"name": name + "-kubeconfig", "namespace": namespace,
                                 "labels": {"cluster.x-k8s.io/cluster-name": name}},
                    "data": {"value": base64.b64encode(yaml.safe_dump(config).encode()).decode()}})
    return out


def link_logs(logs, server, *runners):
    if not logs:
        return
    os.makedirs(logs, exist_ok=True)
    targets = {"etcd.log": os.path.join(server.workdir, "etcd.log"),
               "kube-apiserver.log": os.path.join(server.workdir, "kube-apiserver.log")}
    for runner in runners:
        for name in runner.BINARIES:
            targets[name + ".log"] = os.path.join(runner.workdir, name + ".log")
    for name, target in targets.items():
        link = os.path.join(logs, name)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)


def serve(args):
    with open(args.token_file) as fh:
        token = fh.read().strip()
    workdir = os.path.abspath(args.dir)
    for stale in ("url", "ca.crt"):
        if os.path.exists(os.path.join(workdir, stale)):
            os.remove(os.path.join(workdir, stale))
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopped.append(True))
    t0 = time.monotonic()
    server = kubeapi.KubeApiServer(os.path.join(workdir, "apiserver"), crds=kubeapi.module_crds(), port=args.port,
                                   admin_token=token, test_users=False, aggregation=args.keda)
    # a Kubernetes workload cluster's first control plane Machine gets its nodeRef at Cluster API's next
    # resync after its Node registered (kubeapi.Controllers): 30 s, not 10 minutes, in the lab
    controllers = kubeapi.Controllers(server, os.path.join(workdir, "controllers"),
                                      sync_period=30 if args.workload else None)
    # LAB_KEDA=1: KEDA and the HPA controller beside them (docs/autoscale.md, KEDA)
    runners = [controllers] + ([kubeapi.Keda(server, os.path.join(workdir, "keda"))] if args.keda else [])
    try:
        server.start()
        link_logs(args.logs, server, *runners)
        for runner in runners:
            runner.start()
        api = server.api()
        docs = [doc for path in args.objects for doc in read_stream(path)]
        workloads = dict(w.split("=", 1) for w in args.workload)
        create_all(api, cluster_kubeconfig_secrets(server, docs, workloads) + docs)
        with open(os.path.join(workdir, "ca.crt"), "wb") as out, open(server.ca_cert, "rb") as src:
            out.write(src.read())
        with open(os.path.join(workdir, "url"), "w") as fh:
            fh.write(server.url + "\n")
        print("management cluster on %s in %.1f s: kube-apiserver %s, %s" % (
            server.url, time.monotonic() - t0, api.ok("GET", "/version")["gitVersion"],
            ", ".join(name for runner in runners for name in runner.BINARIES)), flush=True)
        while not stopped:
            for runner in runners:
                for name, (proc, _log) in runner.procs.items():
                    if proc.poll() is not None:
                        print("%s exited (%s):\n%s" % (name, proc.returncode, runner.log_tail(name)), flush=True)
                        stopped.append(True)
            time.sleep(1)
    finally:
        for runner in reversed(runners):
            runner.stop()
        server.stop()
    return 0


def apply(args):
    api = kubeapi.api_from_kubeconfig(args.kubeconfig)
    create_all(api, read_stream(args.file))
    return 0


def claimed(args):
    """name, address and node type (its image's) of each host claimed and provisioned: the pool's hosts
    the MachineDeployments took, which lab/lab.sh waits for as for its other machines."""
    api = kubeapi.api_from_kubeconfig(args.kubeconfig)
    for host in api.list("metal3.io/v1alpha1", "baremetalhosts", args.namespace):
        spec, status = host.get("spec") or {}, host.get("status") or {}
        nics = (status.get("hardware") or {}).get("nics") or []
        state = (status.get("provisioning") or {}).get("state")
        if spec.get("consumerRef") and state in ("provisioning", "provisioned") and nics \
                and host["metadata"]["name"].startswith(args.prefix):
            image = ((spec.get("image") or {}).get("url") or "").rpartition("/")[2].split(".")[0]
            print("%s %s %s" % (host["metadata"]["name"], nics[0]["ip"], image))
    return 0


# the roles of rbac/ that belong in the management cluster (workload_reader.yml is the workload cluster's)
MANAGEMENT_ROLES = ("inventory", "lifecycle", "autoscale", "join_at_boot", "move", "rollout", "keda")


def identity(args):
    """The collection's ServiceAccount with the roles of rbac/ that --role names (by default every
    management-cluster one), and a kubeconfig holding a token of its (what a site does with kubectl apply,
    create serviceaccount, create clusterrolebinding, create token)."""
    parts = args.role or list(MANAGEMENT_ROLES)
    unknown = [p for p in parts if not os.path.isfile(os.path.join(REPO, "rbac", p + ".yml"))]
    if unknown:
        raise SystemExit("lab/mgmt.py identity: no such role in rbac/: %s" % ", ".join(unknown))
    api = kubeapi.api_from_kubeconfig(args.kubeconfig)
    api.namespace(args.namespace)
    subject = {"kind": "ServiceAccount", "name": args.name, "namespace": args.namespace}
    docs = [{"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": args.name, "namespace": args.namespace}}]
    for part in parts:
        with open(os.path.join(REPO, "rbac", part + ".yml")) as fh:
            role = next(doc for doc in yaml.safe_load_all(fh) if doc and doc.get("kind") == "ClusterRole")
        docs += [role, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                        "metadata": {"name": role["metadata"]["name"]},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                    "name": role["metadata"]["name"]},
                        "subjects": [subject]}]
    create_all(api, docs)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": args.seconds}}
    token = api.ok("POST", "/api/v1/namespaces/%s/serviceaccounts/%s/token" % (args.namespace, args.name),
                   request)["status"]["token"]
    with open(args.kubeconfig) as fh:
        config = yaml.safe_load(fh)
    config["users"] = [{"name": args.name, "user": {"token": token}}]
    for context in config.get("contexts") or []:
        context["context"]["user"] = args.name
    old = os.umask(0o077)
    try:
        with open(args.out + ".new", "w") as fh:
            yaml.safe_dump(config, fh)
        os.replace(args.out + ".new", args.out)
    finally:
        os.umask(old)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="lab/mgmt.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve")
    run.add_argument("dir")
    run.add_argument("--port", type=int, required=True)
    run.add_argument("--token-file", required=True, help="the admin user's bearer token (kept out of argv)")
    run.add_argument("--objects", action="append", default=[])
    run.add_argument("--logs", help="link the servers' logs here")
    run.add_argument("--keda", action="store_true", help="KEDA and the HPA controller too (make kube-assets KEDA=1)")
    run.add_argument("--workload", action="append", default=[], metavar="CLUSTER=KUBECONFIG",
                     help="the Cluster's own Kubernetes API (its kubeconfig Secret names it)")
    put = sub.add_parser("apply")
    put.add_argument("kubeconfig")
    put.add_argument("file")
    took = sub.add_parser("claimed")
    took.add_argument("kubeconfig")
    took.add_argument("--namespace", default="metal3")
    took.add_argument("--prefix", default="", help="only hosts whose names start so")
    who = sub.add_parser("identity")
    who.add_argument("kubeconfig", help="the admin's")
    who.add_argument("out", help="the collection's kubeconfig, written")
    who.add_argument("--namespace", default="converged-hpc")
    who.add_argument("--name", default="converged-hpc")
    who.add_argument("--seconds", type=int, default=7 * 86400, help="the token's lifetime")
    who.add_argument("--role", action="append", default=[],
                     help="a role of rbac/ (its file's name: workload_reader), again for more; every management-cluster one unless given")
    args = ap.parse_args(argv)
    if args.command == "claimed":
        return claimed(args)
    if args.command == "identity":
        return identity(args)
    if not kubeapi.assets()[0] or kubeapi.Controllers.BINARIES and not all(
            os.access(os.path.join(kubeapi.assets()[0], b), os.X_OK) for b in kubeapi.Controllers.BINARIES):
        if args.command == "serve":
            sys.exit("lab/mgmt.py: the real servers are not in $KUBEBUILDER_ASSETS (%s): run 'make kube-assets'"
                     % os.environ.get("KUBEBUILDER_ASSETS", "unset"))
    return serve(args) if args.command == "serve" else apply(args)


if __name__ == "__main__":
    sys.exit(main())
