"""move_plan: which hosts a move takes from one MachineDeployment to another, and every reason it cannot work,
named before anything changes."""

import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.converged.hpc.plugins.filter.move_plan import (
    MAX_SIZE, MIN_SIZE, move_pending, move_plan, move_progress, selector_matches)

NS = "metal3"
POOL = "converged.hpc/pool"


def md(name, replicas, annotations=None, template=None):
    return {"metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
            "spec": {"replicas": replicas, "template": {"spec": {"infrastructureRef": {
                "kind": "Metal3MachineTemplate", "name": template or name}}}}}


def template(name, selector):
    return {"metadata": {"name": name, "namespace": NS}, "spec": {"template": {"spec": {"hostSelector": selector}}}}


def host(name, labels, consumer=None):
    return {"metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"consumerRef": {"kind": "Metal3Machine", "name": consumer}} if consumer else {}}


def machine(name, deployment, hostname, deleting=False):
    meta = {"name": name, "namespace": NS, "labels": {"cluster.x-k8s.io/deployment-name": deployment}}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    return {"metadata": meta, "spec": {"infrastructureRef": {"name": name}},
            "status": {"addresses": [{"type": "Hostname", "address": hostname}]}}


@pytest.fixture
def world():
    deployments = [md("hpc-gpu", 2, {MIN_SIZE: "0"}), md("k8s-gpu", 0, {MAX_SIZE: "2"}), md("hpc-compute", 1)]
    templates = [template("hpc-gpu", {"matchLabels": {"gpu": "true", POOL: "hpc-gpu"}}),
                 template("k8s-gpu", {"matchLabels": {"gpu": "true", POOL: "k8s-gpu"}}),
                 template("hpc-compute", {"matchExpressions": [{"key": "gpu", "operator": "NotIn",
                                                                "values": ["true"]}]})]
    hosts = [host("bm-01", {"gpu": "true", POOL: "hpc-gpu"}, "hpc-gpu-aaaaa"),
             host("bm-02", {"gpu": "true", POOL: "hpc-gpu"}, "hpc-gpu-bbbbb"),
             host("bm-03", {POOL: "hpc-compute"}, "hpc-compute-ccccc"),
             host("bm-04", {"gpu": "true", POOL: "k8s-gpu"})]
    machines = [machine("hpc-gpu-aaaaa", "hpc-gpu", "bm-01"), machine("hpc-gpu-bbbbb", "hpc-gpu", "bm-02"),
                machine("hpc-compute-ccccc", "hpc-compute", "bm-03")]
    return deployments, templates, hosts, machines


def plan(world, request, nodes=None):
    return move_plan(request, *world, nodes=nodes)


def test_count_takes_idle_slurm_nodes_first(world):
    out = plan(world, {"from": "hpc-gpu", "to": "k8s-gpu", "count": 1}, nodes={"bm-01": "alloc", "bm-02": "idle"})
    assert out["errors"] == []
    assert out["hosts"] == ["bm-02"] and out["machines"] == ["hpc-gpu-bbbbb"]
    assert out["labels"] == {POOL: "k8s-gpu"}
    assert out["source"]["desired"] == 1 and out["target"]["desired"] == 1
    assert out["line"] == "move bm-02: hpc-gpu 2 -> 1, k8s-gpu 0 -> 1"
    # the states as converged.hpc.slurm_queue gives them
    out = plan(world, {"from": "hpc-gpu", "to": "k8s-gpu", "count": 1}, nodes={"bm-01": "ALLOCATED", "bm-02": "IDLE"})
    assert out["hosts"] == ["bm-02"]


def test_named_hosts_by_host_machine_or_node_name_and_a_label(world):
    out = plan(world, {"from": "hpc-gpu", "to": "k8s-gpu", "hosts": "bm-01,hpc-gpu-bbbbb"})
    assert out["errors"] == [] and out["hosts"] == ["bm-01", "bm-02"]
    out = plan(world, {"from": "hpc-gpu", "to": "k8s-gpu", "label": "gpu=true"})
    assert out["errors"] == [] and out["hosts"] == ["bm-01", "bm-02"]


@pytest.mark.parametrize("request_, expected", [
    ({"from": "hpc-gpu", "to": "hpc-gpu", "count": 1}, "'from' and 'to' are the same MachineDeployment (hpc-gpu)"),
    ({"from": "hpc-gpu", "to": "k8s-gpu"}, "give exactly one of count, hosts or label (given: none)"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "count": 1, "label": "gpu=true"}, "given: count, label"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "count": 0}, "count must be a positive integer, got 0"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "count": "two"}, "count must be a positive integer, got 'two'"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "label": "gpu"}, "label must be key=value, got 'gpu'"),
    ({"from": "", "to": "k8s-gpu", "count": 1}, "'from' must name a MachineDeployment, got ''"),
    ({"from": "hpc-gpu", "to": "nowhere", "count": 1}, "the target MachineDeployment metal3/nowhere does not exist"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "count": 3}, "metal3/hpc-gpu has 2 host(s) to move, 3 asked"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "hosts": ["bm-03"]}, "host bm-03 is not one of metal3/hpc-gpu's (bm-01, bm-02)"),
    ({"from": "hpc-gpu", "to": "k8s-gpu", "label": "rack=r9"}, "no host of metal3/hpc-gpu has the label rack=r9"),
    # a host without a GPU cannot become a GPU worker: its hardware is not what the target selects
    ({"from": "hpc-compute", "to": "k8s-gpu", "count": 1},
     "host bm-03 labelled converged.hpc/pool=k8s-gpu is not one k8s-gpu's hostSelector claims"),
])
def test_what_cannot_work_is_named_and_nothing_is_chosen(world, request_, expected):
    out = plan(world, request_)
    assert any(expected in e for e in out["errors"]), out["errors"]
    assert out["hosts"] == [] and out["machines"] == [] and out["target"] is None


def test_bounds_and_a_source_that_would_claim_the_host_again(world):
    deployments, templates, hosts, machines = world
    deployments[1]["metadata"]["annotations"][MAX_SIZE] = "1"
    out = move_plan({"from": "hpc-gpu", "to": "k8s-gpu", "count": 2}, deployments, templates, hosts, machines)
    assert "k8s-gpu would have 2 replicas, beyond its maximum 1" in out["errors"][0]
    deployments[0]["metadata"]["annotations"][MIN_SIZE] = "2"
    out = move_plan({"from": "hpc-gpu", "to": "k8s-gpu", "count": 1}, deployments, templates, hosts, machines)
    assert any("hpc-gpu would have 1 replicas, beyond its minimum 2" in e for e in out["errors"])
    # a source that selects by hardware only would claim a moved GPU host again
    templates[0]["spec"]["template"]["spec"]["hostSelector"] = {"matchLabels": {"gpu": "true"}}
    deployments[0]["metadata"]["annotations"][MIN_SIZE] = "0"
    out = move_plan({"from": "hpc-gpu", "to": "k8s-gpu", "count": 1}, deployments, templates, hosts, machines)
    assert any("would still be claimed by hpc-gpu's hostSelector" in e for e in out["errors"]), out["errors"]


def test_a_deleting_machine_and_a_deployment_without_a_pool(world):
    deployments, templates, hosts, machines = world
    machines[0] = machine("hpc-gpu-aaaaa", "hpc-gpu", "bm-01", deleting=True)
    out = move_plan({"from": "hpc-gpu", "to": "k8s-gpu", "count": 2}, deployments, templates, hosts, machines)
    assert out["errors"] == ["metal3/hpc-gpu has 1 host(s) to move, 2 asked"]
    deployments.append(md("legacy", 1, template="missing"))
    out = move_plan({"from": "legacy", "to": "k8s-gpu", "count": 1}, deployments, templates, hosts, machines)
    assert "does not take its hosts from a pool" in out["errors"][0] and "missing" in out["errors"][0]


def test_a_request_that_is_not_a_dict_is_refused():
    with pytest.raises(AnsibleFilterError, match="must be a dict"):
        move_plan("hpc-gpu", [], [], [], [])


@pytest.mark.parametrize("operator, labels, expected", [
    ("In", {"gpu": "true"}, True), ("NotIn", {"gpu": "true"}, False), ("Exists", {}, False), ("!", {}, True),
    ("DoesNotExist", {}, None)])
def test_selector_operators_as_capm3_builds_them(operator, labels, expected):
    values = ["true"] if operator in ("In", "NotIn") else []
    assert selector_matches({"matchExpressions": [{"key": "gpu", "operator": operator, "values": values}]},
                            labels) is expected


def typed(deployment, node_type):
    deployment["spec"]["template"]["metadata"] = {"labels": {"node-type": node_type}}
    return deployment


HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"


def test_a_slurm_source_machine_without_our_hook_is_refused(world):
    deployments, templates, hosts, machines = world
    typed(deployments[0], "gpu")
    typed(deployments[1], "kubernetes")
    machines[0]["metadata"]["annotations"] = {HOOK: ""}
    out = move_plan({"from": "hpc-gpu", "to": "k8s-gpu", "count": 2}, deployments, templates, hosts, machines,
                    slurm_node_types=["gpu", "compute"], hook=HOOK)
    assert len(out["errors"]) == 1 and "hpc-gpu-bbbbb" in out["errors"][0] and HOOK in out["errors"][0]
    assert "hpc-gpu-aaaaa" not in out["errors"][0]
    out = move_plan({"from": "hpc-gpu", "to": "k8s-gpu", "hosts": ["bm-01"]}, deployments, templates, hosts,
                    machines, slurm_node_types=["gpu", "compute"], hook=HOOK)
    assert out["errors"] == []
    assert out["source"]["slurm"] is True and out["source"]["node_type"] == "gpu"
    assert out["target"]["slurm"] is False and out["target"]["node_type"] == "kubernetes"


# ---------------------------------------------------------------- move_progress: what a move still has to do

def intent(**over):
    base = {"from": "hpc-gpu", "to": "k8s-gpu", "namespace": NS, "hosts": ["bm-01"], "machines": ["hpc-gpu-aaaaa"],
            "source": {"replicas": 2, "desired": 1}, "target": {"replicas": 0, "desired": 1}}
    base.update(over)
    return base


def state(h, value):
    h["status"] = {"provisioning": {"state": value}}
    return h


def test_progress_before_anything_changed(world):
    deployments, templates, hosts, machines = world
    out = move_progress(intent(), deployments, hosts, machines)
    assert out["errors"] == [] and out["scale_source"] and out["delete_machines"] == ["hpc-gpu-aaaaa"]
    assert out["waiting"] == {"bm-01": "unknown (consumer hpc-gpu-aaaaa)"} and out["scale_target"] and not out["done"]


def test_progress_after_the_source_let_go_then_labelled_then_claimed(world):
    deployments, templates, hosts, machines = world
    deployments[0]["spec"]["replicas"] = 1
    machines[0]["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    state(hosts[0], "deprovisioning")
    out = move_progress(intent(), deployments, hosts, machines)
    assert not out["scale_source"] and out["delete_machines"] == []
    assert out["waiting"] == {"bm-01": "deprovisioning (consumer hpc-gpu-aaaaa)"}
    # deprovisioned: available, no consumer -> to label
    del hosts[0]["spec"]["consumerRef"]
    state(hosts[0], "available")
    machines.pop(0)
    out = move_progress(intent(), deployments, hosts, machines)
    assert out["to_label"] == ["bm-01"] and out["waiting"] == {} and out["scale_target"]
    # labelled and the target raised: unclaimed until the target's Machine is on it and booted
    hosts[0]["metadata"]["labels"][POOL] = "k8s-gpu"
    deployments[1]["spec"]["replicas"] = 1
    out = move_progress(intent(), deployments, hosts, machines)
    assert out["labelled"] == ["bm-01"] and out["unclaimed"] == ["bm-01"] and not out["scale_target"]
    assert not out["done"]
    worker = machine("k8s-gpu-zzzzz", "k8s-gpu", "bm-01")
    worker["spec"]["infrastructureRef"]["name"] = "k8s-gpu-m3m-1"
    worker["status"]["nodeRef"] = {"name": "bm-01"}
    machines.append(worker)
    hosts[0]["spec"]["consumerRef"] = {"kind": "Metal3Machine", "name": "k8s-gpu-m3m-1"}
    out = move_progress(intent(), deployments, hosts, machines)
    assert out["claimed"] == ["bm-01"] and out["done"]


def test_progress_refuses_replicas_changed_meanwhile(world):
    deployments, templates, hosts, machines = world
    deployments[1]["spec"]["replicas"] = 3
    out = move_progress(intent(), deployments, hosts, machines)
    assert len(out["errors"]) == 1 and "k8s-gpu has 3 replicas" in out["errors"][0]
    assert not out["done"] and not out["scale_source"]


def test_progress_names_the_moving_machines_our_hook_still_holds(world):
    deployments, templates, hosts, machines = world
    deployments[0]["spec"]["replicas"] = 1
    machines[0]["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    machines[0]["metadata"]["annotations"] = {HOOK: "converged.hpc"}
    machines[1]["metadata"]["annotations"] = {HOOK: "converged.hpc"}  # not moving: never named
    assert move_progress(intent(), deployments, hosts, machines)["held"] == []  # no hook asked about
    out = move_progress(intent(), deployments, hosts, machines, hook=HOOK)
    assert out["held"] == ["hpc-gpu-aaaaa"] and not out["scale_source"]
    del machines[0]["metadata"]["annotations"]  # scale_down.yml released it
    assert move_progress(intent(), deployments, hosts, machines, hook=HOOK)["held"] == []
    machines.pop(0)  # gone
    assert move_progress(intent(), deployments, hosts, machines, hook=HOOK)["held"] == []


def test_progress_of_something_that_is_not_an_intent():
    with pytest.raises(AnsibleFilterError, match="not a move's intent"):
        move_progress({"from": "a"}, [], [], [])


def test_the_pending_move_is_found_by_its_note(world):
    deployments = world[0]
    assert move_pending(deployments) == {}
    deployments[1]["metadata"]["annotations"]["converged.hpc/move"] = json.dumps(intent())
    assert move_pending(deployments) == intent()
    deployments[1]["metadata"]["annotations"]["converged.hpc/move"] = "moving"
    with pytest.raises(AnsibleFilterError, match="metal3/k8s-gpu: its annotation converged.hpc/move is not a move's"):
        move_pending(deployments)


@pytest.mark.parametrize("changed, problem", [
    (dict(hosts="bm-01"), "hosts is 'bm-01', not a list of host names"),
    (dict(hosts=[]), "hosts is [], not a list of host names"),
    (dict(machines=[None]), "machines is [None], not a list of Machine names"),
    (dict(target={"replicas": 0}), "target is {'replicas': 0}, not its replicas and desired counts"),
    (dict(source={"replicas": "2", "desired": 1}), "source is {'replicas': '2', 'desired': 1}, not its replicas"),
    (dict(source={"replicas": True, "desired": 1}), "source is {'replicas': True, 'desired': 1}, not its replicas"),
    (dict(target={"replicas": 0, "desired": -1}), "target is {'replicas': 0, 'desired': -1}, not its replicas"),
    (dict(namespace=7), "namespace is 7, not a string"),
    (dict(to="hpc-compute"), "it names 'hpc-compute' as the move's target, and sits on k8s-gpu"),
    (dict(to=""), "to is '', not a MachineDeployment's name"),
])
def test_a_note_changed_by_hand_is_refused_naming_what_is_wrong(world, changed, problem):
    """Our note (the annotation converged.hpc/move) edited by hand: the run that finds it stops before the move
    changes anything, naming the MachineDeployment, the field and its value."""
    deployments = world[0]
    bad = intent(**changed)
    deployments[1]["metadata"]["annotations"]["converged.hpc/move"] = json.dumps(bad)
    with pytest.raises(AnsibleFilterError) as err:
        move_pending(deployments)
    assert "MachineDeployment metal3/k8s-gpu: its annotation converged.hpc/move is not a move's note as " \
        "move.yml writes it (" + problem in str(err.value) and "the move it was is not taken on" in str(err.value)


def test_a_huge_hand_written_note_is_shortened_in_the_refusal(world):
    deployments = world[0]
    deployments[1]["metadata"]["annotations"]["converged.hpc/move"] = json.dumps(intent(hosts="x" * 100000))
    with pytest.raises(AnsibleFilterError) as err:
        move_pending(deployments)
    assert len(str(err.value)) < 2000


def test_progress_of_an_intent_with_counts_that_are_not_numbers():
    with pytest.raises(AnsibleFilterError, match=r"not a move's intent \(source is"):
        move_progress(intent(source={"replicas": "two", "desired": 1}), [], [], [])
