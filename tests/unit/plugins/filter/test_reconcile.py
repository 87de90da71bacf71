"""reconcile_plan: Cluster API's view against Slurm's, every difference named."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.reconcile import parse_records, reconcile_plan

HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
NODE_TYPES = {"controller": {"role": "controller"}, "compute": {"role": "compute"}, "gpu": {"role": "compute"},
              "login": {"role": "login"}}


def host(node, machine, features=("compute",), hook=True, node_type="compute"):
    return {"converged_slurm_node_name": node, "converged_node_type": node_type,
            "converged_slurm_features": list(features),
            "capi": {"name": machine, "annotations": {HOOK: "converged-hpc"} if hook else {}}}


# sinfo's compact states as slurmctld 22.05 writes them in a dynamic node's record
STATES = {"idle": "IDLE+DYNAMIC_NORM", "alloc": "ALLOCATED+DYNAMIC_NORM", "mix": "MIXED+DYNAMIC_NORM",
          "drng": "MIXED+DRAIN+DYNAMIC_NORM", "drain": "IDLE+DRAIN+DYNAMIC_NORM", "down": "DOWN+DYNAMIC_NORM",
          "down*": "DOWN+DYNAMIC_NORM+NOT_RESPONDING", "idle*": "IDLE+DYNAMIC_NORM+NOT_RESPONDING",
          "unk*": "UNKNOWN+DYNAMIC_NORM+NOT_RESPONDING"}


def rec(line, mem_spec=None):
    """A record line of `scontrol show node --oneliner` from 'name|state|features' (as sinfo would say it)."""
    name, state, features = line.split("|")
    return ("NodeName=%s Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.40 "
            "AvailableFeatures=%s ActiveFeatures=%s Gres=(null) NodeAddr=10.0.0.1 NodeHostName=%s Version=22.05.8 "
            "OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=22532 Sockets=1 Boards=1 "
            "%sState=%s ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=compute "
            "BootTime=2026-11-25T22:30:00 Reason=ping failed [slurm@2026-11-25T22:39:00]"
            % (name, features, features, name, "" if mem_spec is None else "MemSpecLimit=%s " % mem_spec,
               STATES[state]))


def plan(lines, hostvars, groups, hint=None):
    lines = [rec(line) if "|" in line else line for line in lines]
    groups = dict(groups)
    groups.setdefault("converged_slurm", groups.get("converged_compute", []) + groups.get("converged_controller", []))
    groups.setdefault("converged_leaving", groups.get("converged_leaving_compute", []))
    return reconcile_plan(lines, hostvars, groups, NODE_TYPES, HOOK, hint=hint)


def test_nothing_to_do():
    hv = {"m1": host("cn1", "m1"), "m2": host("cn2", "m2")}
    res = plan(["cn1|idle|compute", "cn2|alloc|compute"], hv, {"converged_compute": ["m1", "m2"]})
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


def test_null_features_no_nodes_and_bad_lines():
    nodes = parse_records([rec("a|idle|(null)"), "", "No nodes in the system"])
    assert nodes == {"a": {"state": "IDLE+DYNAMIC_NORM", "features": set(), "responding": True, "down": False,
                           "free": True, "mem_spec": "0"}}
    assert parse_records(["No nodes in the system"]) == {}
    with pytest.raises(AnsibleFilterError, match="cannot read 'garbage'"):
        parse_records(["garbage"])
    with pytest.raises(AnsibleFilterError, match="cannot read 'a[|]idle[|]compute'"):
        parse_records(["a|idle|compute"])  # sinfo's lines are not records


def test_the_states_slurmctld_writes():
    nodes = parse_records([rec("n%d|%s|compute" % (i, state)) for i, state in enumerate(STATES)])
    by_state = {state: nodes["n%d" % i] for i, state in enumerate(STATES)}
    assert [s for s, n in by_state.items() if n["free"]] == ["idle"]
    assert [s for s, n in by_state.items() if not n["responding"]] == ["down*", "idle*", "unk*"]
    assert [s for s, n in by_state.items() if n["down"]] == ["down", "down*"]


def with_mem(node, mem_spec):
    return {"slurm_compute_mem_spec": mem_spec, **host(node, "m-" + node)}


def test_a_record_that_lost_its_memspeclimit():
    """slurmctld restarted: the idle node is converged again (it registers anew), the busy and the drained are
    named and left as they are, the node that declares none and the one that kept it are fine."""
    hv = {"m-" + n: with_mem(n, mem) for n, mem in
          [("idle", 256), ("busy", 256), ("drained", "256"), ("none", 0), ("kept", 256), ("gone", 256)]}
    hv["m-unset"] = host("unset", "m-unset")  # no slurm_compute_mem_spec: 0
    lines = [rec("idle|idle|compute"), rec("busy|alloc|compute"), rec("drained|drain|compute"),
             rec("none|idle|compute"), rec("kept|idle|compute", mem_spec=256), rec("gone|down*|compute"),
             rec("unset|idle|compute")]
    res = plan(lines, hv, {"converged_compute": sorted(hv)})
    assert res["memory"] == [{"host": "m-" + n, "node": n, "want": "256", "have": "0"}
                             for n in ("busy", "drained", "idle")]
    assert res["memory_pending"] == ["m-busy", "m-drained"]
    assert res["repair"] == ["m-gone", "m-idle"]  # not responding; the idle one registers anew
    assert res["features"] == [] and not res["idle"]

    # registered anew, and the others still busy: nothing to do, the others still named
    lines[0] = rec("idle|idle|compute", mem_spec=256)
    lines[5] = rec("gone|idle|compute", mem_spec=256)
    res = plan(lines, hv, {"converged_compute": sorted(hv)})
    assert res["idle"] and res["repair"] == [] and res["memory_pending"] == ["m-busy", "m-drained"]

    # a record that shows another limit than the one declared is the same case
    res = plan([rec("kept|idle|compute", mem_spec=512)], {"m-kept": with_mem("kept", 256)},
               {"converged_compute": ["m-kept"]})
    assert res["memory"] == [{"host": "m-kept", "node": "kept", "want": "256", "have": "512"}]


def test_a_bad_memspeclimit_is_named():
    with pytest.raises(AnsibleFilterError, match="m-a: slurm_compute_mem_spec '1G' is not a whole number"):
        plan([rec("a|idle|compute")], {"m-a": with_mem("a", "1G")}, {"converged_compute": ["m-a"]})


def test_the_compute_types_as_the_contract_leaves_them_on_the_control_node():
    lines = [rec("ghost|down*|gpu,bigmem"), rec("other|down*|login")]
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
