"""Benchmark: the collection's pure parts at fleet sizes, with no machine - what a run computes on the
control node before and beside its SSH round trips, for N compute hosts:

  contract       the node-type contract over every inventory host (filter converged.hpc.contract)
  placeholders   the placeholder nodes slurm.conf gets on 24.11.0 - 24.11.5 (contract_placeholders)
  reconcile      the reconcile plan with nothing to do: N hosts against N Slurm node records, the
                 records as `scontrol show node --oneliner` prints them (filter reconcile_plan)
  reconcile 25%  the same with a quarter of the records NOT_RESPONDING (each becomes a repair)
  autoscale      the autoscale plan with N pending jobs, half of them array tasks, and N nodes
                 (filter autoscale_plan), one pool per 1,000 hosts
  events         the event source's coalescing of N Machine MODIFIED events (each a transition to
                 Provisioned) into one reconcile event (Watcher.handle, make_event)
  join at boot   the join-at-boot plan for N / 100 MachineDeployments (filter join_at_boot_plan)

Each figure is the best of 3, in seconds, and per host in microseconds; the last column says how the
time grew from the size before (ratio of times / ratio of sizes: 1.0 is linear).

    python3 bench/plans.py [--sizes 1000,10000]
"""

import argparse
import gc
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS = os.path.join(REPO, ".lab", "collections")
sys.path.insert(0, COLLECTIONS)

from ansible_collections.converged.hpc.extensions.eda.plugins.event_source import capi_machines as source  # noqa: E402
from ansible_collections.converged.hpc.plugins.filter.autoscale import autoscale_plan  # noqa: E402
from ansible_collections.converged.hpc.plugins.filter.contract import contract, placeholders  # noqa: E402
from ansible_collections.converged.hpc.plugins.filter.join_at_boot import join_at_boot_plan  # noqa: E402
from ansible_collections.converged.hpc.plugins.filter.reconcile import reconcile_plan  # noqa: E402

HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
NODE_TYPES = {"controller": {"role": "controller"},
              "compute": {"role": "compute", "nodeset": "computeset", "partitions": ["compute"]},
              "login": {"role": "login"}}
PARTITIONS = [{"name": "compute", "default": True}]


def best(fn, runs=3):
    times = []
    for dummy in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def inventory(n):
    """hostvars and groups as the capi_machines inventory gives them, after the contract."""
    hostvars, compute = {}, []
    hostvars["ctl-01"] = {"capi": {"node_type": "controller", "cluster": "hpc", "hostname": "ctl-01",
                                   "name": "ctl-01"}}
    for i in range(n):
        name = "hpc-compute-%05d" % i
        node = "cn-%05d" % i
        compute.append(name)
        hostvars[name] = {
            "capi": {"node_type": "compute", "cluster": "hpc", "hostname": node, "name": name, "namespace": "metal3",
                     "machine_deployment": "hpc-compute-%d" % (i // 1000), "deleting": False, "cpus": 64,
                     "annotations": {HOOK: "converged-hpc"}},
            "converged_node_type": "compute", "converged_slurm_node_name": node,
            "converged_slurm_nodeset": "computeset", "converged_slurm_features": ["compute"],
            "slurm_compute_mem_spec": 256}
    groups = {"all": ["ctl-01"] + compute, "capi_controller": ["ctl-01"], "capi_compute": compute,
              "converged_compute": compute, "converged_controller": ["ctl-01"],
              "converged_slurm": ["ctl-01"] + compute, "converged_leaving_compute": [], "converged_leaving": []}
    return hostvars, groups, compute


def record(node, responding=True):
    state = "IDLE+DYNAMIC_NORM" if responding else "IDLE+DYNAMIC_NORM+NOT_RESPONDING"
    return ("NodeName=%s Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.40 "
            "AvailableFeatures=compute ActiveFeatures=compute Gres=(null) NodeAddr=%s NodeHostName=%s "
            "Version=24.11.5 OS=Linux 6.12.0 #1 SMP PREEMPT_DYNAMIC @0 RealMemory=257000 AllocMem=0 FreeMem=250000 "
            "Sockets=2 Boards=1 MemSpecLimit=256 State=%s ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
            "MCS_label=N/A Partitions=compute BootTime=2026-11-25T22:30:00 SlurmdStartTime=2026-11-25T22:31:00 "
            "LastBusyTime=2026-11-26T10:00:00 ResumeAfterTime=None" % (node, node, node, state))


def machine(i, phase):
    return {"metadata": {"namespace": "metal3", "name": "hpc-compute-%05d" % i, "resourceVersion": str(1000 + i),
                         "labels": {"node-type": "compute"}, "annotations": {HOOK: "converged-hpc"}},
            "status": {"phase": phase}}


def measure(n):
    hostvars, groups, compute = inventory(n)
    out = {}
    applied = contract(hostvars, groups, NODE_TYPES, PARTITIONS, cluster="hpc")
    assert not applied["errors"] and len(applied["hosts"]) == n + 1, (applied["errors"], len(applied["hosts"]))
    out["contract"] = best(lambda: contract(hostvars, groups, NODE_TYPES, PARTITIONS, cluster="hpc"))
    out["placeholders"] = best(lambda: placeholders(NODE_TYPES, hostvars, compute, 32))
    lines = [record(hostvars[h]["converged_slurm_node_name"]) for h in compute]
    plan = reconcile_plan(lines, hostvars, groups, NODE_TYPES, HOOK)
    assert plan["idle"] and plan["slurm_nodes"] == n, plan
    out["reconcile"] = best(lambda: reconcile_plan(lines, hostvars, groups, NODE_TYPES, HOOK))
    quarter = [record(hostvars[h]["converged_slurm_node_name"], responding=i % 4 != 0) for i, h in enumerate(compute)]
    plan = reconcile_plan(quarter, hostvars, groups, NODE_TYPES, HOOK)
    assert len(plan["repair"]) == (n + 3) // 4, len(plan["repair"])
    out["reconcile 25%"] = best(lambda: reconcile_plan(quarter, hostvars, groups, NODE_TYPES, HOOK))
    jobs = [{"id": ("%d_%d" % (100000 + i // 10, i % 10)) if i % 2 else str(200000 + i), "partitions": ["compute"],
             "nodes": 1 + i % 4, "cpus": 1 + i % 64, "memory_mib": 0, "features": "compute" if i % 3 else "",
             "gres": [], "reason": "Resources" if i % 5 else "JobHeldUser", "runnable": bool(i % 5)} for i in range(n)]
    nodes = [{"name": hostvars[h]["converged_slurm_node_name"], "state": "IDLE" if i % 2 else "ALLOCATED", "flags": [],
              "available": True, "busy": not i % 2, "features": ["compute"], "partitions": ["compute"], "cpus": 64,
              "idle_seconds": 30 if i % 2 else None} for i, h in enumerate(compute)]
    pools = [{"namespace": "metal3", "name": "hpc-compute-%d" % p, "node_type": "compute", "nodeset": "computeset",
              "partitions": ["compute"], "features": ["compute"], "replicas": 1000, "min": 0, "max": 2000,
              "scaled_up_at": 0.0} for p in range(max(1, n // 1000))]
    queue = {"jobs": jobs, "nodes": nodes, "partitions": ["compute"], "now": time.time()}
    result = autoscale_plan(queue, pools, hostvars, compute)
    assert len(result["pools"]) == len(pools) and sum(len(p["jobs"]) for p in result["pools"]) == n - (n + 4) // 5
    out["autoscale"] = best(lambda: autoscale_plan(queue, pools, hostvars, compute))

    def coalesce():
        batch = []
        watcher = source.Watcher(None, "v1beta2", "metal3", "", {}, lambda b, initial=False: batch.extend(b), None,
                                 initial=False)
        watcher.known = {("metal3", "hpc-compute-%05d" % i): source.summary(machine(i, "Provisioning"), {})
                         for i in range(n)}
        for i in range(n):
            watcher.handle({"type": "MODIFIED", "object": machine(i, "Provisioned")})
        event = source.make_event(batch)
        assert len(event["capi_machines"]["machines"]) == n
    out["events"] = best(coalesce)
    count = max(1, n // 100)
    deployments = [{"metadata": {"name": "hpc-compute-%d" % d, "namespace": "metal3"},
                    "spec": {"template": {"metadata": {"labels": {"node-type": "compute"},
                                                       "annotations": {HOOK: "converged-hpc"}},
                                          "spec": {"bootstrap": {"dataSecretName": "hpc-compute-%d-join" % d}}}}}
                   for d in range(count)]
    requested = [d["metadata"]["name"] for d in deployments]
    assert not join_at_boot_plan(deployments, requested, NODE_TYPES, HOOK)["errors"]
    out["join at boot"] = best(lambda: join_at_boot_plan(deployments, requested, NODE_TYPES, HOOK))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--sizes", default="1000,10000")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {n: measure(n) for n in sizes}
    parts = list(results[sizes[0]])
    print("| part | " + " | ".join("N = %s: s (us per host)" % format(n, ",") for n in sizes) + " | growth |")
    print("| --- | " + " | ".join("---:" for dummy in sizes) + " | ---: |")
    for part in parts:
        cells = ["%.3f (%.1f)" % (results[n][part], results[n][part] / n * 1e6) for n in sizes]
        growth = ""
        if len(sizes) > 1:
            first, last = sizes[0], sizes[-1]
            growth = "%.2f" % ((results[last][part] / results[first][part]) / (last / first))
        print("| %s | %s | %s |" % (part, " | ".join(cells), growth))


if __name__ == "__main__":
    main()
