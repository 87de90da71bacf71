"""converged.hpc.slurm_node against stand-in scontrol/squeue/scancel commands that keep node state in files.

The real commands run in tests/e2e; here every branch (drain, wait, timeout, force, absent, resume,
check mode) runs quickly and deterministically.
"""

import json

import pytest

from conftest import run_module

from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import parse_node

FAKE = r'''#!/usr/bin/env python3
import json, os, sys
state_file = os.environ["FAKE_SLURM"]
st = json.load(open(state_file))
cmd, args = os.path.basename(sys.argv[0]), sys.argv[1:]
def save(): json.dump(st, open(state_file, "w"))
# a controller that does not answer for a while: fail={cmd: [skip, count]} lets the first `skip`
# calls of cmd through, then fails the next `count`
skip, count = st.get("fail", {}).get(cmd, [0, 0])
if skip:
    st["fail"][cmd] = [skip - 1, count]; save()
elif count:
    st["fail"][cmd] = [0, count - 1]; st.setdefault("failed_calls", []).append(cmd); save()
    print("slurm_load_jobs error: Unable to contact slurm controller (connect failure)", file=sys.stderr)
    sys.exit(1)
if cmd == "scontrol" and args[:2] == ["show", "node"]:
    name = args[-1]
    if name not in st["nodes"]:
        print("Node %s not found" % name, file=sys.stderr); sys.exit(1)
    n = st["nodes"][name]
    print("NodeName=%s Arch=x86_64 CoresPerSocket=2 State=%s Reason=%s" % (name, n["state"], n.get("reason", "")))
elif cmd == "scontrol" and args[0] == "update":
    kv = dict(a.split("=", 1) for a in args[1:])
    n = st["nodes"][kv["nodename"]]
    if kv["state"] == "drain":
        base = n["state"].split("+")[0]
        n["state"] = ("MIXED" if st["jobs"].get(kv["nodename"]) else base if base != "IDLE" else "IDLE") + "+DRAIN"
        n["reason"] = kv["reason"]
    elif kv["state"] == "resume":
        n["state"] = "IDLE"
    save()
elif cmd == "scontrol" and args[0] == "requeue":
    job = args[1]
    if job in st.get("norequeue", []):
        print("Requested operation is presently disabled for job %s" % job, file=sys.stderr); sys.exit(1)
    for node in st["jobs"]:
        if job in st["jobs"][node]:
            st["jobs"][node].remove(job)
            if not st["jobs"][node] and node in st["nodes"]:
                st["nodes"][node]["state"] = "+".join(["IDLE"] + st["nodes"][node]["state"].split("+")[1:])
    st.setdefault("requeued", []).append(job); save()
elif cmd == "scontrol" and args[0] == "delete":
    st["nodes"].pop(args[1].split("=", 1)[1]); save()
elif cmd == "squeue":
    node = args[args.index("--nodelist") + 1]
    st["polls"] = st.get("polls", 0) + 1
    # another run deletes the node once its jobs are done: delete_after={node: polls}
    if st.get("delete_after", {}).get(node) and st["polls"] >= st["delete_after"][node]:
        st["jobs"][node] = []
        st["nodes"].pop(node, None)
    if node not in st["nodes"]:  # as squeue answers for a node Slurm does not know
        save()
        print("squeue: error: Invalid node name %s" % node, file=sys.stderr); sys.exit(1)
    jobs = st["jobs"].get(node, [])
    if jobs and st.get("finish_after") and st["polls"] >= st["finish_after"]:
        st["jobs"][node] = jobs = []
        # the node's own state follows its jobs, unless the test holds it (COMPLETING)
        if node in st["nodes"] and not st.get("hold_state"):
            n = st["nodes"][node]
            n["state"] = "+".join(["IDLE"] + [f for f in n["state"].split("+")[1:]])
    save()
    print("\n".join(jobs))
elif cmd == "scancel":
    for node in st["jobs"]:
        st["jobs"][node] = [j for j in st["jobs"][node] if j not in args]
        if not st["jobs"][node] and node in st["nodes"]:
            st["nodes"][node]["state"] = "+".join(["IDLE"] + st["nodes"][node]["state"].split("+")[1:])
    st.setdefault("cancelled", []).extend(args); save()
'''


@pytest.fixture
def fake(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("scontrol", "squeue", "scancel"):
        path = bindir / name
        path.write_text(FAKE)
        path.chmod(0o755)
    state = tmp_path / "state.json"

    def run(params, nodes=None, jobs=None, finish_after=None, check_mode=False, fail=None, hold_state=False,
            norequeue=(), delete_after=None):
        state.write_text(json.dumps({"nodes": nodes or {}, "jobs": jobs or {}, "finish_after": finish_after,
                                     "fail": fail or {}, "hold_state": hold_state, "norequeue": list(norequeue),
                                     "delete_after": delete_after or {}}))
        out = run_module("slurm_node", dict(params, poll=0.01), bindir, check_mode, FAKE_SLURM=str(state))
        return out, json.loads(state.read_text())

    return run


IDLE = {"cn1": {"state": "IDLE"}}
BUSY = {"cn1": {"state": "MIXED"}}


def test_parse_node_keeps_values_with_spaces():
    node = parse_node("NodeName=cn1 State=IDLE+DRAIN Reason=Machine metal3/x is being deleted [root@2026]")
    assert node["State"] == "IDLE+DRAIN" and node["Reason"] == "Machine metal3/x is being deleted [root@2026]"


def test_drain_idle_node(fake):
    out, st = fake({"name": "cn1", "state": "drained"}, IDLE)
    assert out["changed"] and st["nodes"]["cn1"]["state"] == "IDLE+DRAIN" and out["jobs"] == []


def test_drain_is_idempotent(fake):
    out = fake({"name": "cn1", "state": "drained"}, {"cn1": {"state": "IDLE+DRAIN"}})[0]
    assert not out["changed"]


def test_absent_waits_for_jobs_then_deletes(fake):
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 30}, BUSY, {"cn1": ["41"]}, finish_after=3)
    assert out["changed"] and "cn1" not in st["nodes"] and st["polls"] >= 3 and "cancelled" not in st


def test_timeout_fails_naming_node_and_jobs_and_keeps_node(fake):
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 0}, BUSY, {"cn1": ["41", "42"]})
    assert out["failed"] and "cn1" in out["msg"] and "41, 42" in out["msg"]
    assert st["nodes"]["cn1"]["state"] == "MIXED+DRAIN" and "cancelled" not in st


def test_force_requeues_after_timeout_and_cancels_what_cannot_be_requeued(fake):
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 0, "force": True}, BUSY, {"cn1": ["41", "42"]},
                   norequeue=["42"])
    assert not out.get("failed") and "cn1" not in st["nodes"]
    assert st["requeued"] == ["41"] and st["cancelled"] == ["42"]
    assert out["requeued"] == ["41"] and out["cancelled"] == ["42"]


# ------------------------------------------------ immediate: an urgent removal, never the default
def test_immediate_requeues_at_once_then_deletes(fake):
    # the jobs would run for ever (no finish_after): immediate does not wait for them
    out, st = fake({"name": "cn1", "state": "absent", "immediate": True}, BUSY, {"cn1": ["41", "42", "43"]},
                   norequeue=["43"])
    assert not out.get("failed") and out["changed"] and "cn1" not in st["nodes"]
    assert out["requeued"] == ["41", "42"] and out["cancelled"] == ["43"]
    assert st["requeued"] == ["41", "42"] and st["cancelled"] == ["43"]


def test_immediate_on_an_idle_node_requeues_nothing(fake):
    out, st = fake({"name": "cn1", "state": "absent", "immediate": True}, IDLE)
    assert not out.get("failed") and "cn1" not in st["nodes"] and "requeued" not in st and "requeued" not in out


def test_immediate_never_reads_a_failed_squeue_as_no_jobs(fake):
    out, st = fake({"name": "cn1", "state": "absent", "immediate": True}, BUSY, {"cn1": ["41"]},
                   fail={"squeue": [0, 1000]})
    assert out["failed"] and "cannot list its jobs" in out["msg"] and "cn1" in st["nodes"]
    assert "requeued" not in st and "cancelled" not in st


def test_immediate_in_check_mode_names_the_jobs_and_changes_nothing(fake):
    out, st = fake({"name": "cn1", "state": "absent", "immediate": True}, BUSY, {"cn1": ["41"]}, check_mode=True)
    assert out["changed"] and out["jobs"] == ["41"] and st["nodes"]["cn1"]["state"] == "MIXED"
    assert "requeued" not in st


# ------------------------------------------------ a failed query never means idle
def test_squeue_failing_during_the_drain_is_waited_out(fake):
    # slurmctld restarting: squeue fails three times, then answers; the job ends later; then delete
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 30}, BUSY, {"cn1": ["41"]}, finish_after=3,
                   fail={"squeue": [0, 3]})
    assert not out.get("failed") and "cn1" not in st["nodes"]
    assert st["failed_calls"].count("squeue") == 3


def test_squeue_failing_until_the_timeout_keeps_the_node(fake):
    # the job is gone, but squeue never answers: not proven idle, nothing deleted
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 0}, {"cn1": {"state": "IDLE"}}, {},
                   fail={"squeue": [0, 1000]})
    assert out["failed"] and "cn1 is not proven idle" in out["msg"] and "Unable to contact slurm controller" in out["msg"]
    assert "cn1" in st["nodes"] and st["nodes"]["cn1"]["state"] == "IDLE+DRAIN"


def test_slurm_not_answering_at_the_start_is_waited_out(fake):
    # the module starts while slurmctld restarts: the first two `scontrol show node` fail, then it answers
    out, st = fake({"name": "cn1", "state": "drained", "timeout": 30, "poll": 0.1}, {"cn1": {"state": "IDLE"}}, {},
                   fail={"scontrol": [0, 2]})
    assert not out.get("failed") and st["nodes"]["cn1"]["state"].startswith("IDLE+DRAIN"), out
    out = fake({"name": "cn1", "state": "drained", "timeout": 0}, {"cn1": {"state": "IDLE"}}, {},
               fail={"scontrol": [0, 1000]})[0]
    assert out["failed"] and "scontrol show node cn1 failed" in out["msg"]


def test_scontrol_failing_during_the_wait_is_not_idle(fake):
    # squeue says no jobs, but the node's own state cannot be read: wait, then delete once it answers
    # (the first two scontrol calls - show, then drain - go through)
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 30}, {"cn1": {"state": "IDLE"}}, {},
                   fail={"scontrol": [2, 3]})
    assert not out.get("failed") and "cn1" not in st["nodes"] and st["failed_calls"] == ["scontrol"] * 3
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 0}, {"cn1": {"state": "IDLE"}}, {},
                   fail={"scontrol": [2, 1000]})
    assert out["failed"] and "not proven idle" in out["msg"] and "scontrol show node cn1 failed" in out["msg"]
    assert "cn1" in st["nodes"]


def test_a_node_still_completing_is_not_idle(fake):
    # squeue lists no job any more, but the node is still COMPLETING: keep it
    out, st = fake({"name": "cn1", "state": "absent", "timeout": 0}, {"cn1": {"state": "COMPLETING"}}, {})
    assert out["failed"] and "its state is COMPLETING+DRAIN" in out["msg"]
    assert "cn1" in st["nodes"]


@pytest.mark.parametrize("state", ["drained", "absent"])
def test_a_node_another_run_deletes_during_the_wait_ends_the_wait(fake, state):
    # two scale-downs of the same Machines: the other run deleted the node once its job ended; squeue then
    # refuses the node's name - no failure to wait out for the whole drain timeout
    out, st = fake({"name": "cn1", "state": state, "timeout": 120, "allow_absent": True}, BUSY, {"cn1": ["41"]},
                   delete_after={"cn1": 3})
    assert not out.get("failed") and out["waited"] < 120 and "cn1" not in st["nodes"], out  # not the timeout


def test_absent_node_is_ok(fake):
    out = fake({"name": "gone", "state": "absent"}, IDLE)[0]
    assert not out["changed"] and out["before"] == "absent"


def test_draining_an_unknown_node_fails_unless_allowed(fake):
    out = fake({"name": "gone", "state": "drained"}, IDLE)[0]
    assert out["failed"] and "not known to Slurm" in out["msg"]
    out = fake({"name": "gone", "state": "drained", "allow_absent": True}, IDLE)[0]
    assert not out.get("failed") and not out["changed"] and out["before"] == "absent"


def test_check_mode_changes_nothing(fake):
    out, st = fake({"name": "cn1", "state": "absent"}, BUSY, {"cn1": ["41"]}, check_mode=True)
    assert out["changed"] and st["nodes"]["cn1"]["state"] == "MIXED" and out["jobs"] == ["41"]


def test_resume(fake):
    out, st = fake({"name": "cn1", "state": "resumed"}, {"cn1": {"state": "IDLE+DRAIN"}})
    assert out["changed"] and st["nodes"]["cn1"]["state"] == "IDLE"


@pytest.mark.parametrize("params,text", [({"name": "cn1; rm -rf /", "state": "drained"}, "not a Slurm node name"),
                                         ({"name": "cn1", "reason": " "}, "reason must not be empty"),
                                         ({"name": "cn1", "timeout": -1}, "timeout=-1"),
                                         ({"name": "cn1", "state": "drained", "immediate": True},
                                          "immediate=true only applies to state=absent")])
def test_bad_input(fake, params, text):
    out = fake(params, IDLE)[0]
    assert out["failed"] and text in out["msg"]
