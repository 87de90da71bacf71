"""Benchmark: converged.hpc.capi_machines for 100, 1,000 and 10,000 Machines.

For each size the simulator (on loopback) serves that many Machines, each with
its Metal3Machine and BareMetalHost, shaped like the objects recorded from a
real kube-apiserver (tests/fixtures/capi-hpc.yaml). It prints:

  build     the plugin building the inventory (discovery, paged lists, join, groups,
            Ansible's own host/variable bookkeeping), no cache
  fetch     merely fetching and JSON-decoding the same pages (same page size)
  ratio     build / fetch
  cached    building it from a filled inventory cache (jsonfile), no API call

Usage: python3 bench/inventory.py [--sizes 100,1000,10000] [--page-size 500] [--repeat 3]
"""

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time

import urllib3
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "lab"))
LINK = os.path.join(REPO, ".lab", "collections", "ansible_collections", "converged", "hpc")
if not os.path.exists(LINK):
    os.makedirs(os.path.dirname(LINK), exist_ok=True)
    os.symlink(REPO, LINK)
os.environ.setdefault("ANSIBLE_COLLECTIONS_PATH", os.path.join(REPO, ".lab", "collections"))

from capisim import Identity, Simulator, Store  # noqa: E402

TOKEN = "bench-token"


def templates():
    with open(os.path.join(REPO, "tests", "fixtures", "capi-hpc.yaml")) as fh:
        docs = []
        for doc in yaml.safe_load_all(fh):  # the fixture is one `kind: List` document
            docs.extend((doc.get("items") or []) if doc and doc.get("kind") == "List" else [doc] if doc else [])
    pick = {d["kind"]: d for d in docs if d["metadata"]["name"] in ("hpc-compute-7d9f8-abcde", "hpc-cn-01")}
    return pick["Machine"], pick["Metal3Machine"], pick["BareMetalHost"]


def populate(store, n):
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
    # loaded as a controller wrote them: with status and managedFields, as the real server returns them
    store.load(docs, strict=True)


def fetch_only(url, page_size):
    """The floor: GET every page of the three kinds and json-decode it, nothing else."""
    pool = urllib3.PoolManager()
    headers = {"Authorization": "Bearer " + TOKEN, "Accept": "application/json"}
    count = 0
    for path in ("/apis/cluster.x-k8s.io/v1beta2/machines",
                 "/apis/infrastructure.cluster.x-k8s.io/v1beta2/metal3machines",
                 "/apis/metal3.io/v1alpha1/baremetalhosts"):
        token = None
        while True:
            fields = {"limit": page_size}
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--page-size", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("converged.hpc.capi_machines benchmark: simulator on loopback, page size %d, best of %d"
          % (args.page_size, args.repeat))
    print("%8s  %9s  %9s  %6s  %9s  %s" % ("machines", "build s", "fetch s", "ratio", "cached s", "hosts"))
    for n in sizes:
        store = Store()
        populate(store, n)
        sim = Simulator(store, {TOKEN: Identity("admin")}).start()
        tmp = tempfile.mkdtemp(prefix="capi-bench-")
        try:
            plain = os.path.join(tmp, "bench.capi_machines.yml")
            cached_src = os.path.join(tmp, "cached.capi_machines.yml")
            cache_dir = os.path.join(tmp, "cache")
            config = {"plugin": "converged.hpc.capi_machines", "host": sim.url, "api_key": TOKEN,
                      "page_size": args.page_size}
            with open(plain, "w") as fh:
                yaml.safe_dump(config, fh)
            with open(cached_src, "w") as fh:
                yaml.safe_dump(dict(config, cache=True, cache_timeout=3600, cache_plugin="ansible.builtin.jsonfile",
                                    cache_connection=cache_dir), fh)
            build(cached_src, cache=False)  # fills the cache (not timed)
            builds, fetches, cached = [], [], []
            hosts = 0
            for dummy in range(args.repeat):
                t = time.perf_counter()
                assert fetch_only(sim.url, args.page_size) == 3 * n
                fetches.append(time.perf_counter() - t)
                t = time.perf_counter()
                hosts = build(plain, cache=False)
                builds.append(time.perf_counter() - t)
                t = time.perf_counter()
                assert build(cached_src, cache=True) == hosts
                cached.append(time.perf_counter() - t)
            b, f, c = min(builds), min(fetches), min(cached)
            print("%8d  %9.2f  %9.2f  %6.2f  %9.2f  %d" % (n, b, f, b / f, c, hosts), flush=True)
        finally:
            sim.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
