"""The keepalived role's control script, repair mode (roles/keepalived/templates/slurmctld_control.j2): what
it resumes and releases after this host became MASTER, run as rendered against a scontrol that answers from
files, one set of answers per poll. A failover that launches a job again is Slurm's race (the elastic
lab's soak met it); here each decision is checked on its own: a node Slurm drained for a duplicate launch
is resumed only once its first copy ended, an admin's drain is left, a job held by the failed launch is
released once, and nothing is released when no duplicate launch was seen."""

import os
import stat
import subprocess

import jinja2

from conftest import REPO

TEMPLATE = os.path.join(REPO, "roles", "keepalived", "templates", "slurmctld_control.j2")


def render(tmp_path):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["quote"] = lambda value: "'%s'" % value
    env.filters["bool"] = bool
    env.filters["ternary"] = lambda value, yes, no: yes if value else no
    with open(TEMPLATE) as fh:
        text = env.from_string(fh.read()).render(
            ansible_managed="test", keepalived_slurm_conf=str(tmp_path / "slurm.conf"), keepalived_check_port=6817,
            keepalived_takeover_probe_timeout=0.5, keepalived_check_service="slurmctld", keepalived_takeover_fence=True,
            keepalived_takeover_fence_timeout=30, __keepalived_standby_timeout=0, keepalived_repair_window=180)
    # its locks in the test's directory, not /run
    text = text.replace("/run/converged-hpc", str(tmp_path / "run"))
    (tmp_path / "slurm.conf").write_text("ClusterName=test\nSlurmUser=slurm\nSlurmctldHost=ctl1\n")
    script = tmp_path / "control"
    script.write_text(text)
    script.chmod(0o755)
    return script


STUB = """#!/usr/bin/env bash
# answers from $STUBS: poll N (counted on each 'show node') reads node-N / job-N, or the last one there is
d=$STUBS
case "$1 $2" in
  "show node")
    n=$(( $(cat "$d/polls" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$d/polls"
    while [ ! -f "$d/node-$n" ] && [ "$n" -gt 1 ]; do n=$((n - 1)); done
    cat "$d/node-$n" ;;
  "show job")
    n=$(cat "$d/polls")
    while [ ! -f "$d/job-$n" ] && [ "$n" -gt 1 ]; do n=$((n - 1)); done
    cat "$d/job-$n" 2>/dev/null ;;
  *) echo "poll $(cat "$d/polls") scontrol $*" >> "$d/calls" ;;
esac
"""


def node(name, state, reason=None):
    return "NodeName=%s Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=%s ThreadsPerCore=1%s\n" % (
        name, state, " Reason=%s" % reason if reason else "")


def job(job_id, state, reason):
    return "JobId=%s JobName=wrap UserId=alice(1000) Priority=0 JobState=%s Reason=%s Dependency=(null)\n" % (
        job_id, state, reason)


def run_repair(tmp_path, polls, seconds=3):
    """polls: a list of (node lines, job lines), one per poll (the last repeats); the scontrol calls it made."""
    stubs = tmp_path / "stubs"
    bin_dir = tmp_path / "bin"
    for directory in (stubs, bin_dir, tmp_path / "run"):
        directory.mkdir(exist_ok=True)
    for n, (nodes, jobs) in enumerate(polls, 1):
        (stubs / ("node-%d" % n)).write_text("".join(nodes))
        (stubs / ("job-%d" % n)).write_text("".join(jobs))
    for name, body in (("scontrol", STUB), ("systemctl", "#!/bin/sh\nexit 0\n"), ("logger", "#!/bin/sh\nexit 0\n"),
                       ("sleep", "#!/bin/sh\nexec /bin/sleep 0.3\n")):
        path = bin_dir / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]), STUBS=str(stubs))
    res = subprocess.run([str(render(tmp_path)), "repair", str(seconds)], env=env, capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    calls = stubs / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


DUP = "Duplicate jobid [slurm@2026-11-29T01:40:00]"
HELD = "launch_failed_requeued_held"


def test_a_node_drained_for_a_duplicate_launch_is_resumed_once_its_first_copy_ended(tmp_path):
    calls = run_repair(tmp_path, [
        ([node("cn1", "IDLE+COMPLETING+DRAIN", DUP), node("cn2", "IDLE")], []),
        ([node("cn1", "IDLE+COMPLETING+DRAIN", DUP), node("cn2", "IDLE")], []),
        ([node("cn1", "IDLE+DRAIN", DUP), node("cn2", "IDLE")], []),
        ([node("cn1", "IDLE"), node("cn2", "IDLE")], []),
    ])
    assert calls == ["poll 3 scontrol update nodename=cn1 state=resume"], calls


def test_an_admins_drain_is_left_whatever_its_reason(tmp_path):
    calls = run_repair(tmp_path, [
        ([node("cn1", "IDLE+DRAIN", "Duplicate jobid [root@2026-11-29T01:40:00]"),
          node("cn2", "IDLE+DRAIN", "maintenance [root@2026-11-29T01:40:00]")], []),
    ])
    assert calls == [], calls


def test_a_job_held_by_the_failed_launch_is_released_once(tmp_path):
    held = job(41, "PENDING", HELD)
    calls = run_repair(tmp_path, [
        ([node("cn1", "IDLE+COMPLETING+DRAIN", DUP)], [held, job(42, "PENDING", "Resources")]),
        ([node("cn1", "IDLE")], [held, job(42, "PENDING", "Resources"), job(43, "RUNNING", "None")]),
    ])
    assert calls == ["poll 1 scontrol release 41"], calls


def test_nothing_is_released_when_no_launch_met_a_copy(tmp_path):
    # a job held for its prolog failing: Slurm's hold stands (the node is drained "Prolog/Epilog failure")
    calls = run_repair(tmp_path, [
        ([node("cn1", "IDLE+DRAIN", "Prolog/Epilog failure [slurm@2026-11-29T01:40:00]")],
         [job(41, "PENDING", HELD)]),
    ])
    assert calls == [], calls


def test_a_window_of_0_is_off(tmp_path):
    calls = run_repair(tmp_path, [([node("cn1", "IDLE+DRAIN", DUP)], [job(41, "PENDING", HELD)])], seconds=0)
    assert calls == [] and not (tmp_path / "stubs" / "polls").exists()
