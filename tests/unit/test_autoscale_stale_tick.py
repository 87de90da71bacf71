"""autoscale.yml ends at once for a tick older than its interval (a newer one is queued behind it
in ansible-rulebook), and runs in full for a fresh tick or without one (AWX, by hand)."""

import json
import os
import subprocess
import time

from conftest import REPO, ansible_env


def run(event=None, tz=None):
    extra = ["-e", json.dumps({"ansible_eda": {"event": event}})] if event else []
    env = ansible_env()
    if tz:
        env["TZ"] = tz
    return subprocess.run(["ansible-playbook", "-i", "localhost,", os.path.join(REPO, "playbooks", "autoscale.yml")]
                          + extra, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def tick(age):
    return {"tick": {"index": 7, "time": time.time() - age, "name": "autoscale", "interval": 10.0}}


def test_a_stale_tick_ends_before_the_queue_is_read():
    res = run(tick(age=25))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "tick 7 waited 2" in res.stdout and "more than its interval of 10.0 s: a newer tick is queued" in res.stdout
    assert "Read Slurm's queue and nodes" not in res.stdout and "Fail when no controller answers" not in res.stdout
    # the contract and the controllers' ping are skipped too: a stale tick costs ansible-playbook's start only
    assert "included: converged.hpc.converged" not in res.stdout and "ok: [localhost] => (item=" not in res.stdout


def test_a_fresh_tick_or_none_runs_in_full():
    # this inventory has no controller: a run in full reaches the check and fails on it
    for res in (run(tick(age=0)), run()):
        assert res.returncode == 2, res.stdout[-3000:]
        assert "newer tick is queued" not in res.stdout
        assert "no Slurm controller answers (none in the inventory)" in res.stdout


def test_the_age_of_a_tick_does_not_depend_on_the_time_zone():
    # the tick source stamps time.time(); a control node whose local time is not UTC decides alike
    # (POSIX TZ strings: no tzdata needed)
    for tz in ("XST5", "YST-9"):
        stale, fresh = run(tick(age=25), tz=tz), run(tick(age=0), tz=tz)
        assert "tick 7 waited 2" in stale.stdout and stale.returncode == 0, (tz, stale.stdout[-3000:])
        assert "newer tick is queued" not in fresh.stdout, (tz, fresh.stdout[-3000:])
        assert "no Slurm controller answers" in fresh.stdout, (tz, fresh.stdout[-3000:])
