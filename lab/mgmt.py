"""The lab's management cluster, real: etcd and kube-apiserver, the Cluster API core manager, CAPM3 and the
Bare Metal Operator (test mode: no Ironic) from $KUBEBUILDER_ASSETS (make kube-assets), on loopback.

    python3 lab/mgmt.py serve DIR --port PORT --token-file FILE [--objects FILE]... [--logs DIR]
        start them (state in DIR), install the controllers' CRDs, write the objects a site writes (a
        YAML stream: lab/capi_objects.py --real), a `<cluster>-kubeconfig` Secret for each Cluster (the
        controllers reach the cluster's API through it: here the management cluster's own), then DIR/url
        (its presence says all is ready) and DIR/ca.crt; run until SIGTERM, then stop them all
    python3 lab/mgmt.py apply KUBECONFIG FILE
        create the objects of a YAML stream (e.g. hosts registered later)

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


def cluster_kubeconfig_secrets(server, docs):
    """What a site's bootstrap writes for each workload cluster: <cluster>-kubeconfig (key value). Cluster
    API's cluster cache and CAPM3 connect through it; a Slurm cluster has no Kubernetes API of its own, so
    it names the management cluster's (no Node ever registers there for a Slurm host)."""
    with open(server.ca_cert, "rb") as fh:
        ca = base64.b64encode(fh.read()).decode()
    out = []
    for doc in docs:
        if doc["kind"] != "Cluster":
            continue
        name, namespace = doc["metadata"]["name"], doc["metadata"]["namespace"]
        config = {"apiVersion": "v1", "kind": "Config", "current-context": name,
                  "clusters": [{"name": name, "cluster": {"server": server.url, "certificate-authority-data": ca}}],
                  "users": [{"name": name + "-admin", "user": {"token": server.admin_token}}],
                  "contexts": [{"name": name, "context": {"cluster": name, "user": name + "-admin"}}]}
        out.append({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                    "metadata": {"name": name + "-kubeconfig", "namespace": namespace,
                                 "labels": {"cluster.x-k8s.io/cluster-name": name}},
                    "data": {"value": base64.b64encode(yaml.safe_dump(config).encode()).decode()}})
    return out


def link_logs(logs, server, controllers):
    if not logs:
        return
    os.makedirs(logs, exist_ok=True)
    targets = {"etcd.log": os.path.join(server.workdir, "etcd.log"),
               "kube-apiserver.log": os.path.join(server.workdir, "kube-apiserver.log")}
    for name in controllers.BINARIES:
        targets[name + ".log"] = os.path.join(controllers.workdir, name + ".log")
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
                                   admin_token=token, test_users=False)
    controllers = kubeapi.Controllers(server, os.path.join(workdir, "controllers"))
    try:
        server.start()
        link_logs(args.logs, server, controllers)
        controllers.start()
        api = server.api()
        docs = [doc for path in args.objects for doc in read_stream(path)]
        create_all(api, cluster_kubeconfig_secrets(server, docs) + docs)
        with open(os.path.join(workdir, "ca.crt"), "wb") as out, open(server.ca_cert, "rb") as src:
            out.write(src.read())
        with open(os.path.join(workdir, "url"), "w") as fh:
            fh.write(server.url + "\n")
        print("management cluster on %s in %.1f s: kube-apiserver %s, %s" % (
            server.url, time.monotonic() - t0, api.ok("GET", "/version")["gitVersion"],
            ", ".join(controllers.BINARIES)), flush=True)
        while not stopped:
            for name, (proc, _log) in controllers.procs.items():
                if proc.poll() is not None:
                    print("%s exited (%s):\n%s" % (name, proc.returncode, controllers.log_tail(name)), flush=True)
                    stopped.append(True)
            time.sleep(1)
    finally:
        controllers.stop()
        server.stop()
    return 0


def apply(args):
    with open(args.kubeconfig) as fh:
        config = yaml.safe_load(fh)
    cluster = config["clusters"][0]["cluster"]
    api = kubeapi.Api(cluster["server"], config["users"][0]["user"]["token"], cluster.get("certificate-authority"))
    create_all(api, read_stream(args.file))
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
    put = sub.add_parser("apply")
    put.add_argument("kubeconfig")
    put.add_argument("file")
    args = ap.parse_args(argv)
    if not kubeapi.assets()[0] or kubeapi.Controllers.BINARIES and not all(
            os.access(os.path.join(kubeapi.assets()[0], b), os.X_OK) for b in kubeapi.Controllers.BINARIES):
        if args.command == "serve":
            sys.exit("lab/mgmt.py: the real servers are not in $KUBEBUILDER_ASSETS (%s): run 'make kube-assets'"
                     % os.environ.get("KUBEBUILDER_ASSETS", "unset"))
    return serve(args) if args.command == "serve" else apply(args)


if __name__ == "__main__":
    sys.exit(main())
