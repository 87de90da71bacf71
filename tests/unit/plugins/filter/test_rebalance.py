"""rebalance_plan: idle hosts of one pool go from the side with nothing waiting to the side that waits - Slurm's
pending jobs against the workload cluster's pending Pods - never a busy host, never below a side's minimum,
not within the cooldown, one move per run, one line per pair, bad pairs named before anything is decided."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.converged.hpc.plugins.filter.rebalance import REBALANCED_AT, rebalance_plan

NS = "metal3"
NOW = 1_800_000_000.0
PAIR = {"slurm": "hpc-gpu", "kubernetes": "k8s-gpu", "partition": "gpu", "resource": "nvidia.com/gpu"}


def md(name, annotations=None):
    return {"metadata": {"name": name, "namespace": NS, "annotations": annotations or {}}, "spec": {"replicas": 1}}


def machine(name, deployment, host, node_ref=None):
    status = {"addresses": [{"type": "Hostname", "address": host}], "phase": "Running" if node_ref else "Provisioned"}
    if node_ref:
        status["nodeRef"] = {"name": node_ref}
    return {"metadata": {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/deployment-name": deployment}},
            "spec": {"infrastructureRef": {"name": name}}, "status": status}


def bmh(name, consumer):
    return {"metadata": {"name": name, "namespace": NS, "labels": {"gpu": "true", "nvidia.com/gpu.count": "2"}},
            "spec": {"consumerRef": {"name": consumer}}, "status": {"hardware": {"cpu": {"count": 8}}}}


def pod(name, gpus=1, node=None, phase=None, daemonset=False):
    meta = {"name": name, "namespace": "default"}
    if daemonset:
        meta["ownerReferences"] = [{"kind": "DaemonSet", "name": "gfd"}]
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase or ("Running" if node else "Pending")}}


def job(job_id, nodes=1, partition="gpu", runnable=True):
    return {"id": job_id, "partitions": [partition], "nodes": nodes, "runnable": runnable}


def world(slurm_jobs=(), pods=(), slurm_busy=False, annotations=None):
    queue = {"partitions": ["compute", "gpu"], "now": NOW, "jobs": list(slurm_jobs),
             "nodes": [{"name": "bm-01", "state": "ALLOCATED" if slurm_busy else "IDLE", "busy": slurm_busy,
                        "available": True}]}
    deployments = [md("hpc-gpu", annotations), md("k8s-gpu")]
    hosts = [bmh("bm-01", "hpc-gpu-a"), bmh("bm-02", "k8s-gpu-b")]
    machines = [machine("hpc-gpu-a", "hpc-gpu", "bm-01"), machine("k8s-gpu-b", "k8s-gpu", "bm-02", node_ref="bm-02")]
    nodes = [{"metadata": {"name": "bm-02"}}]
    return queue, list(pods), nodes, deployments, hosts, machines


def decide(pairs, w):
    return rebalance_plan(pairs, *w, now=NOW)


def test_slurm_waits_and_the_idle_gpu_worker_moves_to_slurm():
    # the Slurm GPU node runs a job, another waits; the Kubernetes GPU worker is idle
    out = decide([PAIR], world(slurm_jobs=[job("7")], slurm_busy=True))
    assert out["errors"] == []
    assert out["move"] == {"from": "k8s-gpu", "to": "hpc-gpu", "hosts": ["bm-02"], "namespace": NS}
    assert out["pair"] == {"namespace": NS, "name": "hpc-gpu"}
    assert len(out["lines"]) == 1 and "moving bm-02 from k8s-gpu to hpc-gpu" in out["lines"][0]


def test_pods_wait_and_the_idle_slurm_node_moves_to_kubernetes():
    out = decide([PAIR], world(pods=[pod("train", gpus=1), pod("serving", node="bm-02")]))
    assert out["move"] == {"from": "hpc-gpu", "to": "k8s-gpu", "hosts": ["bm-01"], "namespace": NS}
    assert "Kubernetes needs 1 host(s) for 1 Pod(s)" in out["lines"][0]


def test_a_busy_host_never_moves():
    out = decide([PAIR], world(pods=[pod("train"), pod("serving", node="bm-02")], slurm_busy=True))
    assert out["move"] == {} and "no idle host" in out["lines"][0]
    # the worker runs a Pod: not idle either (a DaemonSet's Pod does not count)
    w = world(slurm_jobs=[job("7")], pods=[pod("serving", node="bm-02")], slurm_busy=True)
    assert decide([PAIR], w)["move"] == {}
    w = world(slurm_jobs=[job("7")], pods=[pod("gfd", gpus=0, node="bm-02", daemonset=True)], slurm_busy=True)
    assert decide([PAIR], w)["move"]["hosts"] == ["bm-02"]


def test_nothing_waits_nothing_moves():
    done = pod("done", node="bm-02", phase="Succeeded")
    out = decide([PAIR], world(slurm_jobs=[job("8", runnable=False)], pods=[done]))
    assert out["move"] == {} and out["lines"][0].endswith("nothing waits, nothing moves")


def test_a_side_keeps_its_minimum():
    out = decide([dict(PAIR, min_kubernetes=1)], world(slurm_jobs=[job("7")], slurm_busy=True))
    assert out["move"] == {} and "minimum 1" in out["lines"][0]


def test_both_wait_the_priority_side_wins():
    # both wait: Slurm's node is busy, a Pod waits beside the idle worker (not yet scheduled)
    w = world(slurm_jobs=[job("7")], pods=[pod("train")], slurm_busy=True)
    out = decide([PAIR], w)
    assert out["move"]["to"] == "hpc-gpu" and "both wait, slurm has priority" in out["lines"][0]
    out = decide([dict(PAIR, priority="kubernetes")], w)
    assert out["move"] == {} and "kubernetes's own idle hosts are enough" in out["lines"][0]


def test_cooldown():
    w = world(slurm_jobs=[job("7")], slurm_busy=True, annotations={REBALANCED_AT: str(int(NOW - 30))})
    out = decide([dict(PAIR, cooldown=60)], w)
    assert out["move"] == {} and "moved 30 s ago (cooldown 60 s)" in out["lines"][0]
    assert decide([dict(PAIR, cooldown=20)], w)["move"]["hosts"] == ["bm-02"]


def test_pods_are_counted_in_hosts_by_a_host_s_gpus():
    # three 1-GPU Pods on 2-GPU hosts: two hosts; only one idle Slurm node, so one moves
    out = decide([PAIR], world(pods=[pod("a"), pod("b"), pod("c"), pod("serving", node="bm-02")]))
    assert "Kubernetes needs 2 host(s) for 3 Pod(s)" in out["lines"][0] and out["move"]["hosts"] == ["bm-01"]


def test_one_move_per_run():
    other = dict(PAIR, partition="compute")
    out = decide([PAIR, other], world(slurm_jobs=[job("7"), job("9", partition="compute")], slurm_busy=True))
    assert out["move"]["hosts"] == ["bm-02"] and len(out["lines"]) == 2
    assert "in a later run" in out["lines"][1]


@pytest.mark.parametrize("pair, named", [
    (dict(PAIR, slurm="nope"), "slurm MachineDeployment metal3/nope does not exist"),
    (dict(PAIR, partition="debug"), "Slurm has no partition 'debug'"),
    (dict(PAIR, priority="both"), "priority must be slurm or kubernetes, got 'both'"),
    (dict(PAIR, min_slurm=-1), "min_slurm must be a whole number >= 0, got -1"),
    (dict(PAIR, resource=""), "resource must name what the Pods ask for"),
])
def test_bad_pairs_are_named(pair, named):
    out = decide([pair], world(slurm_jobs=[job("7")]))
    assert out["move"] == {} and any(named in e for e in out["errors"]), out["errors"]


def test_pairs_must_be_a_list():
    with pytest.raises(AnsibleFilterError, match="must be a list"):
        rebalance_plan({"slurm": "x"}, {}, [], [], [], [], [], now=NOW)
