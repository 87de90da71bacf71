"""move_plan: which hosts a move takes from one MachineDeployment to another, and every reason it cannot work,
named before anything changes."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.converged.hpc.plugins.filter.move_plan import MAX_SIZE, MIN_SIZE, move_plan, selector_matches

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
