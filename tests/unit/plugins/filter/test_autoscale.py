"""autoscale_pools and autoscale_plan: the autoscaler's input checks and decisions."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.autoscale import (
    MAX_ANNOTATION, MIN_ANNOTATION, autoscale_plan, autoscale_pools, constraint_met, gres_met)

NODE_TYPES = {"controller": {"role": "controller"},
              "compute": {"role": "compute", "nodeset": "computeset", "partitions": ["compute"]},
              "gpu": {"role": "compute", "nodeset": "gpuset", "partitions": ["gpu"]},
              "login": {"role": "login"}}
NOW = 1_000_000.0


def md(name, node_type, replicas=0, annotations=None, labels=None):
    template = {"node-type": node_type}
    template.update(labels or {})
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations or {}},
            "spec": {"replicas": replicas, "template": {"metadata": {"labels": template}}}}


def pool(name="hpc-compute", node_type="compute", replicas=0, low=0, high=3, scaled_up_at=0.0, features=None):
    spec = NODE_TYPES[node_type]
    return {"namespace": "ns", "name": name, "node_type": node_type, "nodeset": spec["nodeset"],
            "partitions": spec["partitions"], "features": features or [node_type], "replicas": replicas,
            "min": low, "max": high, "scaled_up_at": scaled_up_at}


def job(job_id, nodes=1, partition="compute", reason="PartitionConfig", features="", cpus=1, runnable=None):
    runnable = reason in ("Resources", "Priority", "PartitionConfig", "None") if runnable is None else runnable
    return {"id": job_id, "partitions": [partition], "nodes": nodes, "cpus": cpus, "memory_mib": 0,
            "features": features, "reason": reason, "runnable": runnable}


def node(name, state="IDLE", idle_seconds=0, features=("compute",), cpus=2, available=True):
    return {"name": name, "state": state, "flags": [], "available": available,
            "busy": state in ("ALLOCATED", "MIXED", "COMPLETING"), "features": list(features),
            "partitions": ["compute"], "cpus": cpus, "idle_seconds": idle_seconds if state == "IDLE" else None}


def machines(*names, deployment="hpc-compute", deleting=()):
    return {n: {"converged_slurm_node_name": n,
                "capi": {"name": "m-" + n, "namespace": "ns", "machine_deployment": deployment,
                         "deleting": n in deleting, "cpus": 2}} for n in names}


def plan(jobs, nodes, pools, hostvars=None, **kw):
    hostvars = hostvars or {}
    return autoscale_plan({"jobs": jobs, "nodes": nodes, "partitions": ["compute", "gpu"], "now": NOW}, pools,
                          hostvars, list(hostvars), **kw)


# ------------------------------------------------------------------ pools and their checks
def test_pools_from_annotations_and_settings():
    mds = [md("hpc-compute", "compute", 1, {MIN_ANNOTATION: "1", MAX_ANNOTATION: "5"},
              labels={"feature.slurm.converged.hpc/highmem": "true", "feature.slurm.converged.hpc/old": "false"}),
           md("hpc-gpu", "gpu"), md("hpc-controller", "controller", 1)]
    res = autoscale_pools(mds, NODE_TYPES, [{"name": "hpc-gpu", "max": 2}], slurm_partitions=["compute", "gpu"])
    assert res["errors"] == []
    assert [(p["name"], p["min"], p["max"], p["nodeset"]) for p in res["pools"]] == [
        ("hpc-compute", 1, 5, "computeset"), ("hpc-gpu", 0, 2, "gpuset")]
    assert res["pools"][0]["features"] == ["compute", "highmem"]
    # a setting wins over the annotation; MachineDeployments with neither are not autoscaled
    res = autoscale_pools(mds, NODE_TYPES, [{"name": "hpc-compute", "min": 0, "max": 2}])
    assert [(p["name"], p["min"], p["max"]) for p in res["pools"]] == [("hpc-compute", 0, 2)]


@pytest.mark.parametrize("mds, settings, partitions, message", [
    ([md("hpc-compute", "compute")], [{"name": "hpc-compute", "min": 3, "max": 1}], None, "min 3 > max 1"),
    ([md("hpc-compute", "compute")], [{"name": "hpc-compute", "min": "x", "max": 1}], None, "min 'x' is not a whole"),
    ([md("hpc-compute", "compute")], [{"name": "hpc-compute", "max": -1}], None, "max -1 is negative"),
    ([md("hpc-compute", "compute")], [{"name": "hpc-compute"}], None, "no max"),
    ([md("hpc-login", "login")], [{"name": "hpc-login", "max": 2}], None,
     "node type login, which feeds no Slurm nodeset (the contract's compute node types: compute, gpu)"),
    ([md("hpc-x", "unknown", annotations={MAX_ANNOTATION: "2"})], [], None, "node type unknown, which feeds no"),
    ([md("hpc-compute", "compute")], [{"name": "hpc-cmpute", "max": 2}], None,
     "names MachineDeployment hpc-cmpute, which the cluster does not have (it has: hpc-compute)"),
    ([md("hpc-gpu", "gpu")], [{"name": "hpc-gpu", "max": 2}], ["compute"],
     "partition(s) gpu of node type gpu do not exist in Slurm (it has: compute)"),
])
def test_bad_input_is_named(mds, settings, partitions, message):
    res = autoscale_pools(mds, NODE_TYPES, settings, slurm_partitions=partitions)
    assert any(message in e for e in res["errors"]), res["errors"]


def test_settings_must_be_a_list():
    with pytest.raises(AnsibleFilterError, match="must be a list"):
        autoscale_pools([], NODE_TYPES, {"name": "x"})


# ------------------------------------------------------------------ decisions
def test_empty_pool_grows_to_what_the_jobs_need():
    res = plan([job("1", 1), job("2", 2), job("3", 2)], [], [pool(high=10)])
    p = res["pools"][0]
    assert (p["replicas"], p["desired"], p["action"], p["demand"], p["jobs"]) == (0, 5, "up", 5, ["1", "2", "3"])
    assert "replicas 0 -> 5" in p["line"] and "pending 3 job(s) needing 5 node(s)" in p["line"]


def test_max_caps_and_says_so():
    p = plan([job("1", 1), job("2", 2), job("3", 2)], [], [pool(high=3)])["pools"][0]
    assert p["desired"] == 3 and "max 3 reached: 3 job(s) wait" in p["line"]
    # at max already: nothing more
    hv = machines("cn1", "cn2", "cn3")
    busy = [node(n, "ALLOCATED") for n in ("cn1", "cn2", "cn3")]
    p = plan([job("4", 1, reason="Resources")], busy, [pool(replicas=3, high=3)], hv)["pools"][0]
    assert p["action"] == "none" and p["desired"] == 3 and "max 3 reached" in p["line"]


def test_joining_and_idle_nodes_count_against_demand():
    # 2 replicas: one idle Slurm node, one Machine still joining: a 2-node job needs nothing more
    hv = machines("cn1")
    p = plan([job("1", 2, reason="Resources")], [node("cn1")], [pool(replicas=2)], hv)["pools"][0]
    assert p["action"] == "none" and p["joining"] == 1 and p["idle"] == ["cn1"]
    # a 3-node job needs one more
    p = plan([job("1", 3, reason="Resources")], [node("cn1")], [pool(replicas=2)], hv)["pools"][0]
    assert p["desired"] == 3


def test_cpus_turn_into_nodes():
    hv = machines("cn1")
    p = plan([job("1", 1, cpus=5, reason="Resources")], [node("cn1", "ALLOCATED", cpus=2)],
             [pool(replicas=1, high=10)], hv)["pools"][0]
    assert p["demand"] == 3 and p["desired"] == 4


def test_jobs_that_more_nodes_would_not_start_scale_nothing():
    gpu_job = dict(job("11"), gres=["gpu:2"])
    jobs = [job("7", reason="JobHeldUser"), job("8", reason="Dependency"),
            job("9", features="infiniband", reason="PartitionConfig"), job("10", partition="debug"), gpu_job]
    res = plan(jobs, [], [pool()])
    assert res["pools"][0]["action"] == "none" and not res["changes"]
    assert res["waiting"] == [
        "job 7: pending for JobHeldUser - more nodes would not start it",
        "job 8: pending for Dependency - more nodes would not start it",
        "job 9: no autoscaled MachineDeployment can run it (partition compute, constraint infiniband)",
        "job 10: no autoscaled MachineDeployment can run it (partition debug)",
        "job 11: no autoscaled MachineDeployment can run it (partition compute, gres gpu:2)"]
    assert res["lines"][1:] == res["waiting"]


def test_a_job_goes_to_the_pool_its_partition_and_features_name():
    pools = [pool(), pool("hpc-gpu", "gpu", features=["gpu", "a100"])]
    res = plan([job("1", partition="gpu", features="a100"), job("2")], [], pools)
    by = {p["name"]: p for p in res["pools"]}
    assert by["hpc-gpu"]["jobs"] == ["1"] and by["hpc-compute"]["jobs"] == ["2"]


def test_idle_nodes_go_after_the_idle_time_never_busy_never_below_min():
    hv = machines("cn1", "cn2", "cn3")
    nodes = [node("cn1", idle_seconds=400), node("cn2", idle_seconds=100), node("cn3", "ALLOCATED")]
    p = plan([], nodes, [pool(replicas=3)], hv, idle_time=300)["pools"][0]
    assert p["desired"] == 2 and p["victims"] == [{"namespace": "ns", "name": "m-cn1", "node": "cn1"}]
    assert "idle timer: cn2 100/300 s" in p["line"]
    # min 2: cn1 still goes; min 3 keeps it
    p = plan([], nodes, [pool(replicas=3, low=2)], hv, idle_time=300)["pools"][0]
    assert p["desired"] == 2 and [v["node"] for v in p["victims"]] == ["cn1"]
    p = plan([], nodes, [pool(replicas=3, low=3)], hv, idle_time=300)["pools"][0]
    assert p["action"] == "none" and p["victims"] == [] and "min 3 kept" in p["line"]
    # every node idle long enough, min 0: down to zero
    nodes = [node(n, idle_seconds=900) for n in ("cn1", "cn2", "cn3")]
    p = plan([], nodes, [pool(replicas=3)], hv, idle_time=300)["pools"][0]
    assert p["desired"] == 0 and sorted(v["node"] for v in p["victims"]) == ["cn1", "cn2", "cn3"]


def test_no_scale_down_while_jobs_wait_or_during_the_cooldown():
    hv = machines("cn1", "cn2")
    nodes = [node("cn1", idle_seconds=900), node("cn2", "ALLOCATED")]
    p = plan([job("5", 1, reason="Priority")], nodes, [pool(replicas=2)], hv)["pools"][0]
    assert p["action"] == "none" and p["victims"] == []
    p = plan([], nodes, [pool(replicas=2, scaled_up_at=NOW - 30)], hv, cooldown=120)["pools"][0]
    assert p["action"] == "none" and "cooldown: scaled up 30 s ago (120 s)" in p["line"]
    p = plan([], nodes, [pool(replicas=2, scaled_up_at=NOW - 300)], hv, cooldown=120)["pools"][0]
    assert p["desired"] == 1


def test_below_min_grows_and_leaving_machines_do_not_count():
    hv = machines("cn1", "cn2", deleting=("cn2",))
    nodes = [node("cn1", idle_seconds=5), node("cn2", idle_seconds=900)]
    p = plan([], nodes, [pool(replicas=1, low=2)], hv)["pools"][0]
    assert p["desired"] == 2 and "below min 2" in p["line"] and p["idle"] == ["cn1"]


def test_not_a_queue():
    with pytest.raises(AnsibleFilterError, match="slurm_queue"):
        autoscale_plan({"stdout": ""}, [], {}, [])


@pytest.mark.parametrize("constraint, features, met", [
    ("", ["compute"], True), ("gpu", ["compute"], False), ("gpu&a100", ["gpu", "a100"], True),
    ("gpu,a100", ["gpu"], False), ("[a100|h100]", ["h100"], True), ("gpu*2", ["gpu"], True),
])
def test_constraints(constraint, features, met):
    assert constraint_met(constraint, features) is met


@pytest.mark.parametrize("wanted, offered, met", [
    ([], [], True), (["gpu:2"], [], False), (["gpu:2"], ["gpu:a100:4"], True), (["gpu:a100:2"], ["gpu:a100:4"], True),
    (["gpu:h100:1"], ["gpu:a100:4"], False), (["gpu:5"], ["gpu:a100:4"], False), (["gpu"], ["gpu:1"], True),
])
def test_gres(wanted, offered, met):
    assert gres_met(wanted, offered) is met


@pytest.mark.parametrize("written", ["inf", "-inf", "nan", "-5", "yesterday", "1e400"])
def test_our_scale_up_time_changed_by_hand_holds_no_scale_down(written):
    """converged.hpc/scaled-up-at edited into something autoscale.yml never writes counts as no scale-up: the
    cooldown since one cannot hold the pool's idle nodes for good."""
    mds = [md("hpc-compute", "compute", 2, {MAX_ANNOTATION: "3", "converged.hpc/scaled-up-at": written})]
    res = autoscale_pools(mds, NODE_TYPES)
    assert res["errors"] == [] and res["pools"][0]["scaled_up_at"] == 0.0
    nodes = [node("cn-1", idle_seconds=900), node("cn-2", idle_seconds=900)]
    p = plan([], nodes, res["pools"], machines("cn-1", "cn-2"), cooldown=120)["pools"][0]
    assert p["desired"] == 0, p
