"""rollout_plan: which old Machine goes next, when a rollout waits, stops or is done."""

import calendar
import json
import time

import pytest

from ansible_collections.converged.hpc.plugins.filter.rollout_plan import in_service, rollout_plan

REQUEST = {"template": "hpc-compute-v2", "max_unavailable": 1, "join_timeout": 300}
TEMPLATES = ["hpc-compute", "hpc-compute-v2"]


def deployment(replicas=4, template="hpc-compute-v2", note=None):
    meta = {"name": "hpc-compute", "namespace": "metal3"}
    if note is not None:
        meta["annotations"] = {"converged.hpc/rollout": json.dumps(note)}
    return {"metadata": meta, "spec": {"replicas": replicas, "template": {"spec": {
        "bootstrap": {"dataSecretName": "hpc-compute-join"}, "infrastructureRef": {"name": template}}}}}


def machineset(name, template):
    return {"metadata": {"name": name}, "spec": {"template": {"spec": {
        "bootstrap": {"dataSecretName": "hpc-compute-join"}, "infrastructureRef": {"name": template}}}}}


SETS = [machineset("ms-old", "hpc-compute"), machineset("ms-new", "hpc-compute-v2")]


def machine(name, owner, host=None, deleting=False, created="2026-12-02T10:00:00Z"):
    meta = {"name": name, "ownerReferences": [{"kind": "MachineSet", "name": owner}], "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:05:00Z"
    return {"metadata": meta, "status": {"addresses": [{"type": "Hostname", "address": host}] if host else []}}


def node(name, state="IDLE", flags=()):
    return {"name": name, "state": state, "flags": list(flags)}


NOW = float(calendar.timegm(time.strptime("2026-12-02T10:10:00Z", "%Y-%m-%dT%H:%M:%SZ")))


def test_order_out_of_service_then_idle_then_soonest_end():
    machines = [machine("m%d" % i, "ms-old", "cn-%d" % i) for i in range(1, 5)]
    nodes = [node("cn-1", "ALLOCATED"), node("cn-2", "MIXED"), node("cn-3"), node("cn-4", "IDLE", ["DRAIN"])]
    running = [{"id": "1", "nodes": ["cn-1"], "end": NOW + 300}, {"id": "2", "nodes": ["cn-2"], "end": NOW + 100},
               {"id": "3", "nodes": ["cn-1", "cn-2"], "end": NOW + 50}]
    plan = rollout_plan(REQUEST, deployment(), SETS, machines, TEMPLATES, nodes=nodes, running=running, now=NOW)
    assert plan["errors"] == []
    assert [m["machine"] for m in plan["old"]] == ["m4", "m3", "m2", "m1"]
    assert plan["old"][2]["end"] == NOW + 100 and plan["old"][3]["end"] == NOW + 300
    # cn-4 out of service already: taking it leaves the 3 in service
    assert plan["in_service"] == 3 and plan["floor"] == 3 and plan["next"] == "m4"
    assert "out of service" in plan["why"]


def test_a_job_without_a_time_limit_ends_last():
    machines = [machine("m1", "ms-old", "cn-1"), machine("m2", "ms-old", "cn-2")]
    nodes = [node("cn-1", "ALLOCATED"), node("cn-2", "ALLOCATED")]
    running = [{"id": "1", "nodes": ["cn-1"], "end": None}, {"id": "2", "nodes": ["cn-2"], "end": NOW + 5000}]
    plan = rollout_plan(dict(REQUEST, max_unavailable=2), deployment(replicas=2), SETS, machines, TEMPLATES,
                        nodes=nodes, running=running, now=NOW)
    assert [m["machine"] for m in plan["old"]] == ["m2", "m1"] and plan["next"] == "m2"


def test_waits_for_the_new_machine_before_a_second_old_one_goes():
    machines = [machine("m%d" % i, "ms-old", "cn-%d" % i) for i in range(2, 5)] + [
        machine("n1", "ms-new", None, created="2026-12-02T10:08:00Z")]
    nodes = [node("cn-%d" % i) for i in range(2, 5)]
    plan = rollout_plan(REQUEST, deployment(), SETS, machines, TEMPLATES, nodes=nodes, now=NOW)
    assert plan["next"] == "" and plan["unjoined"] == ["n1"] and plan["overdue"] == []
    assert "wait for new Machine(s) n1" in plan["why"]
    # it joins: the next old one may go
    machines[-1] = machine("n1", "ms-new", "cn-9", created="2026-12-02T10:08:00Z")
    plan = rollout_plan(REQUEST, deployment(), SETS, machines, TEMPLATES, nodes=nodes + [node("cn-9")], now=NOW)
    assert plan["next"] == "m2" and plan["in_service"] == 4


def test_a_new_machine_that_does_not_join_in_time_stops_the_rollout():
    machines = [machine("m2", "ms-old", "cn-2"), machine("n1", "ms-new", "cn-9", created="2026-12-02T10:00:00Z")]
    # its slurmd never registered: Slurm does not know cn-9
    plan = rollout_plan(REQUEST, deployment(replicas=2), SETS, machines, TEMPLATES, nodes=[node("cn-2")], now=NOW)
    assert plan["overdue"] == ["n1"] and plan["next"] == ""
    assert plan["why"] == "new Machine(s) n1 did not join Slurm within 300 s" and plan["stop"]
    # registered but down: not joined either
    plan = rollout_plan(REQUEST, deployment(replicas=2), SETS, machines, TEMPLATES,
                        nodes=[node("cn-2"), node("cn-9", "DOWN", ["NOT_RESPONDING"])], now=NOW)
    assert plan["overdue"] == ["n1"]


def test_a_machine_being_deleted_goes_first_and_done_at_the_end():
    machines = [machine("m1", "ms-old", "cn-1", deleting=True), machine("n1", "ms-new", "cn-5")]
    plan = rollout_plan(REQUEST, deployment(replicas=2), SETS, machines, TEMPLATES,
                        nodes=[node("cn-1", "IDLE", ["DRAIN"]), node("cn-5")], now=NOW)
    assert plan["next"] == "m1" and "being deleted already" in plan["why"] and not plan["done"]
    machines = [machine("n1", "ms-new", "cn-5"), machine("n2", "ms-new", "cn-6")]
    plan = rollout_plan(REQUEST, deployment(replicas=2), SETS, machines, TEMPLATES,
                        nodes=[node("cn-5"), node("cn-6", "MIXED", ["MAINT", "RESERVED"])], now=NOW)
    assert plan["done"] and plan["old"] == [] and plan["next"] == ""


def test_capacity_below_the_floor_with_nothing_to_wait_for_says_so():
    machines = [machine("m1", "ms-old", "cn-1"), machine("m2", "ms-old", "cn-2"), machine("n1", "ms-new", "cn-5")]
    nodes = [node("cn-1"), node("cn-2"), node("cn-5", "IDLE", ["DRAIN"])]
    plan = rollout_plan(REQUEST, deployment(replicas=3), SETS, machines, TEMPLATES, nodes=nodes, now=NOW - 500)
    assert plan["next"] == "" and plan["unjoined"] == ["n1"] and not plan["stop"]
    plan = rollout_plan(dict(REQUEST, join_timeout=1), deployment(replicas=3), SETS, machines, TEMPLATES, nodes=nodes,
                        now=NOW)
    assert plan["overdue"] == ["n1"]


def test_bad_requests_name_the_bad_value():
    plan = rollout_plan(dict(REQUEST, template="hpc-compute-v3"), deployment(), SETS, [], TEMPLATES)
    assert plan["errors"] == ["converged_rollout_template=hpc-compute-v3: no such Metal3MachineTemplate in namespace "
                              "metal3 (it has hpc-compute, hpc-compute-v2)"]
    plan = rollout_plan(dict(REQUEST, max_unavailable="0", join_timeout="soon"), deployment(), SETS, [], TEMPLATES)
    assert plan["errors"] == ["converged_rollout_max_unavailable='0': expected a whole number, at least 1",
                              "converged_rollout_join_timeout='soon': expected a whole number, at least 1"]
    plan = rollout_plan({"max_unavailable": 1, "join_timeout": 5}, deployment(), SETS, [], TEMPLATES)
    assert "name the new template" in plan["errors"][0]
    plan = rollout_plan(dict(REQUEST, back=True), deployment(), SETS, [], TEMPLATES)
    assert plan["errors"][0].startswith("converged_rollout_back: MachineDeployment hpc-compute has no rollout")


def test_resume_and_back():
    old, new = {"template": "hpc-compute", "bootstrap": "hpc-compute-join"}, \
        {"template": "hpc-compute-v2", "bootstrap": "hpc-compute-join"}
    note = {"state": "running", "from": old, "to": new}
    plan = rollout_plan(REQUEST, deployment(note=note), SETS, [], TEMPLATES)
    assert plan["resuming"] and plan["previous"] == old and plan["target"] == new
    # stopped: going back targets where it came from
    note = {"state": "stopped", "from": old, "to": new}
    plan = rollout_plan({"back": True, "max_unavailable": 1, "join_timeout": 5}, deployment(note=note), SETS, [],
                        TEMPLATES)
    assert plan["errors"] == [] and plan["target"] == old and plan["previous"] == new and not plan["resuming"]
    # a way back under way goes on with it
    note = {"state": "running", "from": new, "to": old, "back": True}
    back = {"back": True, "max_unavailable": 1, "join_timeout": 5}
    plan = rollout_plan(back, deployment(template="hpc-compute", note=note), SETS, [machine("m1", "ms-new", "cn-1")], TEMPLATES, nodes=[node("cn-1")])
    assert plan["target"] == old and plan["resuming"] and [m["machine"] for m in plan["old"]] == ["m1"]


def test_in_service():
    assert in_service(node("a", "MIXED", ["MAINT", "RESERVED"])) and in_service(node("a", "PLANNED"))
    assert not in_service(None) and not in_service(node("a", "IDLE", ["DRAIN"]))
    assert not in_service(node("a", "DOWN")) and not in_service(node("a", "ALLOCATED", ["NOT_RESPONDING"]))


def test_not_a_request():
    from ansible.errors import AnsibleFilterError
    with pytest.raises(AnsibleFilterError):
        rollout_plan("x", {}, [], [], [])


def test_too_few_in_service_and_nothing_to_wait_for_stops():
    machines = [machine("m1", "ms-old", "cn-1"), machine("m2", "ms-old", "cn-2")]
    plan = rollout_plan(REQUEST, deployment(replicas=3), SETS, machines, TEMPLATES, nodes=[node("cn-1"), node("cn-2")],
                        now=NOW)
    assert plan["stop"] and plan["next"] == "" and "fewer than the 2 allowed" in plan["why"]


def test_a_machine_leaving_without_our_hook_is_left_out():
    hook = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
    gone = machine("m1", "ms-old", "cn-1", deleting=True)
    held = machine("m2", "ms-old", "cn-2", deleting=True)
    held["metadata"]["annotations"] = {hook: ""}
    plan = rollout_plan(REQUEST, deployment(replicas=2), SETS, [gone, held, machine("n1", "ms-new", "cn-5")], TEMPLATES,
                        nodes=[node("cn-5")], now=NOW, hook=hook)
    assert [m["machine"] for m in plan["old"]] == ["m2"] and plan["next"] == "m2"
