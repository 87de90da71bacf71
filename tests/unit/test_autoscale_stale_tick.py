"""autoscale.yml ends at once for a tick that came before the start of its last full run (that run
answered it; ticks queue behind long runs in ansible-rulebook), and runs in full for a tick after it,
for the first tick, or without one (AWX, by hand). The tick source's stamp file holds that start."""

import json
import os
import re
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


def tick(stamp, age=0.0):
    return {"tick": {"index": 7, "time": time.time() - age, "name": "autoscale", "interval": 10.0,
                     "stamp": str(stamp)}}


def ran_in_full(res):
    # no controller in this inventory: a full run gets as far as saying so, after the contract and the ping
    return res.returncode == 2 and "no Slurm controller answers (none in the inventory)" in res.stdout


def test_a_tick_a_full_run_has_answered_ends_before_anything_is_read(tmp_path):
    stamp = tmp_path / "stamp"
    stamp.write_text("%f\n" % (time.time() - 5))
    res = run(tick(stamp, age=25))
    assert res.returncode == 0, res.stdout[-3000:]
    said = re.search(r"tick 7 came ([\d.]+) s ago, before the run that started ([\d.]+) s ago", res.stdout)
    assert said, res.stdout[-3000:]
    # both ages grow by the time ansible-playbook took to start (seconds on a loaded machine); the gap stays 20 s
    came, started = float(said.group(1)), float(said.group(2))
    assert came >= 25 and started >= 5 and abs(came - started - 20) < 0.2, said.group(0)
    assert "Read Slurm's queue and nodes" not in res.stdout and "Fail when no controller answers" not in res.stdout
    # the contract and the controllers' ping are skipped too: such a tick costs ansible-playbook's start only
    assert "included: converged.hpc.converged" not in res.stdout and "ok: [localhost] => (item=" not in res.stdout
    assert float(stamp.read_text()) < time.time() - 4  # not a full run: the stamp stays


def test_the_first_tick_and_every_tick_after_a_full_runs_start_run_in_full(tmp_path):
    stamp = tmp_path / "stamp"
    stamp.write_text("")  # as the source makes it
    first = run(tick(stamp, age=40))  # however late: no full run has answered it
    assert ran_in_full(first) and "this run ends" not in first.stdout, first.stdout[-3000:]
    started = float(stamp.read_text())
    assert abs(started - time.time()) < 30
    # a tick that came after that start runs in full however long it waited; one before it does not
    later = {"tick": dict(tick(stamp)["tick"], time=started + 0.5)}
    assert ran_in_full(run(later)) and float(stamp.read_text()) > started
    assert run({"tick": dict(tick(stamp)["tick"], time=started)}).returncode == 0


def test_without_a_stamp_or_a_tick_every_run_is_in_full(tmp_path):
    gone = tmp_path / "removed-by-the-stopped-source"
    for res in (run(), run(tick(gone, age=30)), run({"tick": {"index": 1, "time": time.time(), "interval": 10.0}})):
        assert ran_in_full(res) and "this run ends" not in res.stdout, res.stdout[-3000:]
    assert not gone.exists()  # a stamp is never made by the playbook


def test_the_stamp_does_not_depend_on_the_time_zone(tmp_path):
    # the tick source stamps time.time(); a control node whose local time is not UTC records the same epoch
    # (POSIX TZ strings: no tzdata needed)
    for tz in ("XST5", "YST-9"):
        stamp = tmp_path / tz
        stamp.write_text("")
        assert ran_in_full(run(tick(stamp), tz=tz))
        started = float(stamp.read_text())
        assert abs(started - time.time()) < 30, (tz, started)
        res = run({"tick": dict(tick(stamp)["tick"], time=started - 1)}, tz=tz)
        assert res.returncode == 0 and "this run ends" in res.stdout, (tz, res.stdout[-3000:])
