"""Benchmark: converged.hpc.capi_machines for 100, 1,000 and 10,000 Machines.

For each size a real kube-apiserver (etcd and kube-apiserver from $KUBEBUILDER_ASSETS, make kube-assets;
the CRDs of ../shared/k8s/crds, over TLS on loopback) holds that many Machines, each with its
Metal3Machine and BareMetalHost, shaped like the objects recorded from a real kube-apiserver
(tests/fixtures/capi-hpc.yaml), created then given their status by their controllers' field managers
(managedFields as the server writes them). It prints, best of --repeat, in seconds:

  floor     GET every page of the three lists, one after another, and json.loads it: the
            floor the issue measures the plugin against
  build     the plugin building the inventory (discovery, the lists, join, groups, Ansible's
            own host and variable bookkeeping), no cache, default (lean) hostvars
  ratio     build / floor
  full      the same build with hostvars: full
  cached    the build from a filled inventory cache (jsonfile), no API call
  m-floor   Machines only: every page, one after another, json.loads
  peer      Machines only, as a plain script does it: one unpaged GET and json.loads
  m-build   the plugin with metal3: never (Machines only)

and then, at the largest size, what `ansible-inventory --list` costs per host, lean and full.

Usage: python3 bench/inventory.py [--sizes 100,1000,10000] [--page-size 500] [--repeat 3]
"""

import argparse
import concurrent.futures
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import urllib3
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
LINK = os.path.join(REPO, ".lab", "collections", "ansible_collections", "converged", "hpc")
if not os.path.exists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(REPO, LINK)
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(REPO, ".lab", "collections"))

import kubeapi  # noqa: E402

TOKEN = kubeapi.ADMIN_TOKEN


def templates():
    with open(os.path.join(REPO, "tests", "fixtures", "capi-hpc.yaml")) as fh:
        docs = []
        for doc in yaml.safe_load_all(fh):  # the fixture is one `kind: List` document
            docs.extend((doc.get("items") or []) if doc and doc.get("kind") == "List" else [doc] if doc else [])
    pick = {d["kind"]: d for d in docs if d["metadata"]["name"] in ("hpc-compute-7d9f8-abcde", "hpc-cn-01")}
    return pick["Machine"], pick["Metal3Machine"], pick["BareMetalHost"]


def populate(server, n):
    machine, m3m, bmh = templates()
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scale"}}]
    for i in range(n):
        name, host = "hpc-compute-%05d" % i, "hpc-cn-%05d" % i
        ip = "10.%d.%d.%d" % (100 + i // 65536, (i // 256) % 256, i % 256)
        for kind, tpl in (("Machine", machine), ("Metal3Machine", m3m), ("BareMetalHost", bmh)):
            obj = copy.deepcopy(tpl)
            meta = obj["metadata"]
            meta["name"] = host if kind == "BareMetalHost" else name
            meta["namespace"] = "scale"
            for key in ("uid", "resourceVersion", "creationTimestamp", "ownerReferences"):
                meta.pop(key, None)
            if kind == "Machine":
                obj["spec"]["infrastructureRef"]["name"] = name
                obj["spec"]["providerID"] = "metal3://scale/%s/%s" % (host, name)
                obj["status"]["addresses"] = [{"type": "InternalIP", "address": ip},
                                              {"type": "Hostname", "address": host}]
            elif kind == "Metal3Machine":
                meta["annotations"]["metal3.io/BareMetalHost"] = "scale/" + host
            else:
                obj["status"]["hardware"]["nics"][0]["ip"] = ip
            docs.append(obj)
    # written as their controllers write them (kubeapi's Api.load: created, then their status, by each kind's
    # field manager), by 8 writers at once
    server.api().load(docs[:1])
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: server.api().load(docs[1 + i::8]), range(8)))


KINDS = ("/apis/cluster.x-k8s.io/v1beta2/machines",
         "/apis/infrastructure.cluster.x-k8s.io/v1beta2/metal3machines",
         "/apis/metal3.io/v1alpha1/baremetalhosts")


def fetch_only(url, ca_cert, page_size, paths=KINDS):
    """GET every page of each kind, one after another, and json-decode it, nothing else."""
    pool = urllib3.PoolManager(ca_certs=ca_cert)
    headers = {"Authorization": "Bearer " + TOKEN, "Accept": "application/json"}
    count = 0
    for path in paths:
        token = None
        while True:
            fields = {"limit": page_size} if page_size else {}
            if token:
                fields["continue"] = token
            resp = pool.request("GET", url + path, fields=fields, headers=headers)
            data = json.loads(resp.data)
            count += len(data["items"])
            token = data["metadata"].get("continue")
            if not token:
                break
    return count


def build(source, cache):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader

    if not getattr(build, "ready", False):
        init_plugin_loader([os.path.join(REPO, ".lab", "collections")])
        build.ready = True
    inv = InventoryManager(loader=DataLoader(), sources=[source], cache=cache)
    return len(inv.hosts)


def cli_list(source, plugin="converged.hpc.capi_machines"):
    """ansible-inventory --list into a file: (seconds, bytes)."""
    out = source + ".json"
    env = dict(os.environ, ANSIBLE_INVENTORY_ENABLED=plugin)
    t = time.perf_counter()
    subprocess.run(["ansible-inventory", "-i", source, "--list", "--output", out], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t, os.path.getsize(out)


PEER = """#!%s
# a plain inventory script: Machines only, one unpaged GET, grouped by node-type, ansible_host
import json, ssl, sys, urllib.request
req = urllib.request.Request("%s/apis/cluster.x-k8s.io/v1beta2/machines",
                             headers={"Authorization": "Bearer %s", "Accept": "application/json"})
items = json.loads(urllib.request.urlopen(req, context=ssl.create_default_context(cafile=%r)).read())["items"]
out = {"_meta": {"hostvars": {}}}
for m in items:
    name, labels = m["metadata"]["name"], m["metadata"].get("labels") or {}
    addr = [a["address"] for a in m.get("status", {}).get("addresses", []) if a["type"] == "InternalIP"]
    out.setdefault(labels.get("node-type", "ungrouped"), {"hosts": []})["hosts"].append(name)
    out["_meta"]["hostvars"][name] = {"ansible_host": addr[0] if addr else name}
json.dump(out, sys.stdout)
"""


def cli_peer(tmp, url, ca_cert):
    """ansible-inventory --list of the plain script (seconds, bytes)."""
    script = os.path.join(tmp, "peer.py")
    with open(script, "w") as fh:
        fh.write(PEER % (sys.executable, url, TOKEN, ca_cert))
    os.chmod(script, 0o755)
    return cli_list(script, "ansible.builtin.script")


def best(fn, repeat):
    times = []
    for dummy in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    assets, missing = kubeapi.assets()
    if missing:
        sys.exit("bench/inventory.py needs the real kube-apiserver: %s (make kube-assets)" % missing)
    sizes = [int(s) for s in args.sizes.split(",")]
    print("converged.hpc.capi_machines benchmark: a real kube-apiserver on loopback (TLS), page size %d, "
          "best of %d, %d cores" % (args.page_size, args.repeat, os.cpu_count()))
    cols = ("machines", "floor", "build", "ratio", "full", "cached", "m-floor", "peer", "m-build", "hosts")
    print("%8s" % cols[0] + "".join("%9s" % c for c in cols[1:]))
    for n in sizes:
        tmp = tempfile.mkdtemp(prefix="capi-bench-")
        server = kubeapi.KubeApiServer(os.path.join(tmp, "apiserver"), assets_dir=assets, test_users=False)
        try:
            server.start()
            t = time.perf_counter()
            populate(server, n)
            print("  (%d Machines, Metal3Machines and BareMetalHosts written in %.0f s)" % (n, time.perf_counter() - t),
                  flush=True)
            url, ca = server.url, server.ca_cert
            config = {"plugin": "converged.hpc.capi_machines", "host": url, "api_key": TOKEN, "ca_cert": ca,
                      "page_size": args.page_size}
            sources = {}
            for name, extra in (("lean", {}), ("full", {"hostvars": "full"}), ("never", {"metal3": "never"}),
                                ("cached", {"cache": True, "cache_timeout": 3600,
                                            "cache_plugin": "ansible.builtin.jsonfile",
                                            "cache_connection": os.path.join(tmp, "cache")})):
                sources[name] = os.path.join(tmp, "%s.capi_machines.yml" % name)
                with open(sources[name], "w") as fh:
                    yaml.safe_dump(dict(config, **extra), fh)
            hosts = build(sources["cached"], cache=False)  # fills the cache (not timed)
            assert hosts == n, (hosts, n)
            floor = best(lambda: fetch_only(url, ca, args.page_size), args.repeat)
            lean = best(lambda: build(sources["lean"], cache=False), args.repeat)
            full = best(lambda: build(sources["full"], cache=False), args.repeat)
            cached = best(lambda: build(sources["cached"], cache=True), args.repeat)
            m_floor = best(lambda: fetch_only(url, ca, args.page_size, KINDS[:1]), args.repeat)
            peer = best(lambda: fetch_only(url, ca, 0, KINDS[:1]), args.repeat)
            m_build = best(lambda: build(sources["never"], cache=False), args.repeat)
            row = (floor, lean, lean / floor, full, cached, m_floor, peer, m_build)
            print("%8d" % n + "".join("%9.2f" % v for v in row) + "%9d" % hosts, flush=True)
            if n == sizes[-1]:
                for name, what in (("lean", "lean hostvars"), ("full", "full hostvars"),
                                   ("never", "lean hostvars, metal3: never"), ("peer", "the plain script")):
                    secs, size = cli_peer(tmp, url, ca) if name == "peer" else cli_list(sources[name])
                    print("  ansible-inventory --list, %s: %.2f s, %.1f MB: %.0f us and %d bytes a host"
                          % (what, secs, size / 1e6, secs / n * 1e6, size // n), flush=True)
        finally:
            server.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
