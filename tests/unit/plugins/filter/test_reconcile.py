"""reconcile_plan: Cluster API's view against Slurm's, every difference named."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.reconcile import parse_sinfo, reconcile_plan

HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
NODE_TYPES = {"controller": {"role": "controller"}, "compute": {"role": "compute"}, "gpu": {"role": "compute"},
              "login": {"role": "login"}}


def host(node, machine, features=("compute",), hook=True, node_type="compute"):
    return {"converged_slurm_node_name": node, "converged_node_type": node_type,
            "converged_slurm_features": list(features),
            "capi": {"name": machine, "annotations": {HOOK: "converged-hpc"} if hook else {}}}


def plan(lines, hostvars, groups, hint=None):
    groups = dict(groups)
    groups.setdefault("converged_slurm", groups.get("converged_compute", []) + groups.get("converged_controller", []))
    groups.setdefault("converged_leaving", groups.get("converged_leaving_compute", []))
    return reconcile_plan(lines, hostvars, groups, NODE_TYPES, HOOK, hint=hint)


def test_nothing_to_do():
    hv = {"m1": host("cn1", "m1"), "m2": host("cn2", "m2")}
    res = plan(["cn1|idle|compute", "cn1|idle|compute", "cn2|alloc|compute"], hv, {"converged_compute": ["m1", "m2"]})
    assert res["idle"] and res["slurm_nodes"] == 2
    assert not (res["new"] or res["repair"] or res["leaving"] or res["ghosts"] or res["features"])


def test_new_repair_features_leaving_ghosts():
    hv = {"m1": host("cn1", "m1"), "m2": host("cn2", "m2"), "m3": host("cn3", "m3", features=("compute", "gpu")),
          "m4": host("cn4", "m4"), "m5": host("cn5", "m5", hook=False), "m6": host("cn6", "m6")}
    lines = ["cn2|down*|compute", "cn3|mix|compute", "cn4|idle|compute", "cn5|idle|compute", "cn6|drng|compute",
             "old1|idle*|compute", "old2|down|gpu", "busy|alloc|compute", "manual|idle|debug"]
    res = plan(lines, hv, {"converged_compute": ["m1", "m2", "m3"], "converged_leaving_compute": ["m4", "m5", "m6"]})
    assert res["new"] == ["m1"]
    assert res["repair"] == ["m2", "m3"]  # not responding; features differ
    assert res["features"] == [{"host": "m3", "node": "cn3", "want": ["compute", "gpu"], "have": ["compute"]}]
    assert res["leaving"] == ["m4", "m6"]  # m5's hook is already released: not ours to touch
    assert res["ghosts"] == ["old1", "old2"]  # no Machine, not responding
    assert res["ghosts_alive"] == ["busy"]  # no Machine but alive: reported, left alone
    assert not res["idle"]


def test_a_leaving_node_is_no_ghost_and_the_hint_is_checked():
    hv = {"m4": host("cn4", "m4")}
    res = plan(["cn4|idle*|compute"], hv, {"converged_leaving_compute": ["m4"]}, hint=["m4", "m9", ""])
    assert res["ghosts"] == [] and res["leaving"] == ["m4"]
    assert res["hint_unknown"] == ["m9"]


def test_unknown_state_is_repaired():
    res = plan(["cn1|unk*|compute"], {"m1": host("cn1", "m1")}, {"converged_compute": ["m1"]})
    assert res["repair"] == ["m1"] and res["features"] == []


def test_null_features_and_bad_lines():
    assert parse_sinfo(["a|idle|(null)", ""]) == {"a": {"state": "idle", "features": set()}}
    with pytest.raises(AnsibleFilterError, match="cannot read sinfo line 'garbage'"):
        parse_sinfo(["garbage"])


def test_the_compute_types_as_the_contract_leaves_them_on_the_control_node():
    lines = ["ghost|down*|gpu,bigmem", "other|down*|login"]
    by_dict = reconcile_plan(lines, {}, {}, NODE_TYPES, HOOK)
    by_names = reconcile_plan(lines, {}, {}, ["compute", "gpu"], HOOK)
    assert by_dict["ghosts"] == by_names["ghosts"] == ["ghost"]


@pytest.mark.parametrize("hint", [
    "m1,gone", "['m1', 'gone']", ["m1", "gone"], [{"name": "m1", "resourceVersion": "3"}, {"name": "gone"}],
    [["m1"], [{"name": "gone", "namespace": "metal3"}], []], ["", "m1,gone"],
])
def test_a_hint_in_every_shape_it_arrives_in(hint):
    hv = {"m1": host("cn1", "m1")}
    res = plan(["cn1|idle|compute"], hv, {"converged_compute": ["m1"]}, hint=hint)
    assert res["hint_unknown"] == ["gone"] and res["idle"]
