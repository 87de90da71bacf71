"""The soak's schedule (tests/soak.py): seeded, so a failed run can be replayed; within its bounds."""

import argparse

import pytest

import soak


def test_the_same_seed_gives_the_same_schedule_and_jobs_another_seed_others():
    assert soak.make_schedule(42, 600, (1, 4)) == soak.make_schedule(42, 600, (1, 4))
    assert soak.make_jobs(42, 600) == soak.make_jobs(42, 600)
    assert soak.make_schedule(42, 600, (1, 4)) != soak.make_schedule(43, 600, (1, 4))
    assert soak.make_jobs(42, 600) != soak.make_jobs(43, 600)


def test_every_step_is_within_the_run_and_its_bounds():
    seen = set()
    for seed in range(1, 40):
        steps = soak.make_schedule(seed, 600, (2, 5))
        assert steps and [s["at"] for s in steps] == sorted(s["at"] for s in steps)
        for step in steps:
            seen.add(step["kind"])
            assert 0 < step["at"] < 600 and step["kind"] in soak.KINDS
            if step["kind"] == "scale":
                assert 2 <= step["replicas"] <= 5
            if step["kind"] == "burst":
                assert len(step["replicas"]) == 2 and all(2 <= n <= 5 for n in step["replicas"])
            if step["kind"] in soak.OUTAGE:
                low, high = soak.OUTAGE[step["kind"]]
                assert low <= step["for"] <= high
            if step["kind"] in ("slurmd", "power"):
                assert 0 <= step["pick"] <= 1
    assert seen == set(soak.KINDS)  # every fault comes, over a few seeds


def test_the_jobs_are_of_every_kind_and_requeueable_shapes():
    kinds = {job[1] for seed in range(1, 10) for job in soak.make_jobs(seed, 600)}
    assert kinds == set(soak.JOBS)
    for job in soak.make_jobs(5, 600):
        kind, args = job[1], job[2]
        assert ("--nodes=2" in args) == (kind == "two-node")
        assert ("--array=" in args) == (kind == "array")


def test_a_node_is_picked_by_its_fraction_of_the_list_then():
    assert soak.Soak.pick(["a", "b", "c"], 0.0) == "a"
    assert soak.Soak.pick(["a", "b", "c"], 0.5) == "b"
    assert soak.Soak.pick(["a", "b", "c"], 1.0) == "c"
    assert soak.Soak.pick([], 0.3) is None


@pytest.mark.parametrize("text", ["0-3", "4-2", "3", "a-b", "1-"])
def test_a_bad_replicas_range_is_refused_naming_it(text):
    with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
        soak.replicas_range(text)


def test_the_schedule_is_printed_without_a_lab(capsys):
    assert soak.main(["--schedule", "--seed", "9", "--minutes", "2"]) == 0
    out = capsys.readouterr().out
    assert '"seed": 9' in out and '"faults"' in out and '"jobs"' in out


def test_a_kind_left_out_never_comes():
    for seed in range(1, 20):
        assert "primary" not in {s["kind"] for s in soak.make_schedule(seed, 600, (1, 4), without=("primary",))}


def test_the_api_comes_back_first_and_a_power_on_waits_for_it():
    # seed 675341's hour: a machine's power due back at 2357 s, the API (stopped at 2354 s) at 2370 s; the
    # power-on asks the API for the machine's Machine, so it must not run while the soak holds the API stopped
    import io
    import time as clock

    run = soak.Soak(lab=None, seed=675341, seconds=60, replicas=(1, 3), hold_limit=600, out=io.StringIO())
    run.t0 = clock.time()
    done = []
    now = clock.time()
    run.outages = [(now - 2, "power", lambda: done.append("power")),
                   (now + 3600, "api", lambda: done.append("api"))]
    run.undo_due()
    assert done == []  # the API is still held stopped: the power-on waits, the soak does not
    run.outages = [(t - 7200 if what == "api" else t, what, undo) for t, what, undo in run.outages]
    run.undo_due()
    assert done == ["api", "power"]
    run.outages = [(now + 60, "power", lambda: done.append("power 2")),
                   (now + 90, "api", lambda: done.append("api 2"))]
    run.undo_due(everything=True)  # at the end (or interrupted): the API first all the same
    assert done[2:] == ["api 2", "power 2"] and run.outages == []


def test_a_missing_job_accepted_just_before_the_primary_was_killed_is_named_as_the_window():
    run = soak.Soak(lab=None, seed=1, seconds=60, replicas=(1, 2), hold_limit=60)
    run.submitted = {"7": 100.0, "8": 50.0, "9": 120.0}
    run.faults = [{"kind": "primary", "done": "primary's machine killed", "when": 100.4},
                  {"kind": "power", "done": "cn-01 off", "when": 50.5},
                  {"kind": "primary", "done": "", "when": 121.0}]  # skipped: not a kill
    assert run.window("7") == (" (accepted 0.4 s before the primary's machine was killed: the state-save window, "
                               "docs/ha.md)")
    assert run.window("8") == ""  # a power fault is no such window
    assert run.window("9") == ""
    assert run.window("10") == ""  # never accepted by sbatch (no time known)
