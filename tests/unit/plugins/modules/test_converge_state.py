"""converged.hpc.converge_state on a scratch tree, with a stand-in systemctl that reports unit states from a file.

The module runs for real in tests/e2e/test_shape.py (site.yml's fast path on a lab cluster); here every
difference it must see, and its check mode, run quickly."""

import json
import os

import pytest

from conftest import run_module

FAKE_SYSTEMCTL = r'''#!/usr/bin/env python3
import json, os, sys
states = json.load(open(os.environ["FAKE_UNITS"]))
units = [a for a in sys.argv[1:] if not a.startswith("-") and a != "show"]
print("\n\n".join("Id=%s.service\nLoadState=%s\nActiveState=%s\nUnitFileState=%s" % ((u,) + tuple(states.get(
    u, "not-found/inactive/").split("/"))) for u in units))
'''

SECRET = "not-a-real-key-but-secret-all-the-same"


@pytest.fixture
def host(tmp_path):
    """A scratch host: /etc-like tree, a data directory, units; run(params) runs the module."""
    etc = tmp_path / "etc"
    (etc / "slurm").mkdir(parents=True)
    (etc / "slurm" / "slurm.conf").write_text("ClusterName=lab\n")
    (etc / "munge").mkdir()
    (etc / "munge" / "munge.key").write_text(SECRET)
    (etc / "munge" / "munge.key").chmod(0o400)
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "state").write_text("changes all the time\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bindir / "systemctl").chmod(0o755)
    units = tmp_path / "units.json"
    units.write_text(json.dumps({"munge": "loaded/active/enabled", "slurmd": "loaded/active/enabled"}))
    stamp = tmp_path / "state" / "converge-state.json"
    base = {"digest": "d1", "trees": [str(etc / "slurm"), str(etc / "munge"), str(tmp_path / "nothing-here")],
            "stat_only": [str(spool)], "units": ["munge", "slurmd", "sssd"], "stamp": str(stamp)}

    def run(check_mode=False, **params):
        return run_module("converge_state", dict(base, **params), bindir, check_mode, FAKE_UNITS=str(units))

    run.etc, run.spool, run.units, run.stamp, run.tmp = etc, spool, units, stamp, tmp_path
    return run


def recorded(host):
    assert host(state="present")["changed"] is True
    assert host()["current"] is True


def test_no_stamp_is_a_difference_and_present_records_once(host):
    out = host()
    assert out["current"] is False and out["changed"] is False
    assert out["reasons"] == ["no stamp (the last converge did not finish on this host, or it never ran)"]
    assert host(state="present")["changed"] is True
    assert host(state="present")["changed"] is False
    out = host()
    assert out["current"] is True and out["reasons"] == []


def test_the_stamp_is_root_only_and_holds_no_content(host):
    recorded(host)
    assert oct(os.stat(host.stamp).st_mode & 0o777) == "0o600"
    text = host.stamp.read_text()
    assert SECRET not in text and "ClusterName" not in text
    assert str(host.etc / "munge" / "munge.key") in json.loads(text)["paths"]


def test_other_inputs_are_a_difference(host):
    recorded(host)
    assert host(digest="d2")["reasons"] == ["inputs changed (inventory, variables or the collection)"]


@pytest.mark.parametrize("change, reason", [
    (lambda h: (h.etc / "slurm" / "slurm.conf").write_text("ClusterName=other\n"), "slurm/slurm.conf changed"),
    (lambda h: (h.etc / "slurm" / "slurm.conf").chmod(0o600), "slurm/slurm.conf changed"),
    (lambda h: (h.etc / "slurm" / "gres.conf").write_text(""), "slurm/gres.conf appeared"),
    (lambda h: (h.etc / "munge" / "munge.key").unlink(), "munge/munge.key is gone"),
    (lambda h: os.symlink("/nowhere", h.etc / "slurm" / "link"), "slurm/link appeared"),
    (lambda h: (h.tmp / "nothing-here").mkdir(), "nothing-here changed"),
    (lambda h: h.spool.chmod(0o700), "spool changed"),
])
def test_each_file_difference_is_named(host, change, reason):
    recorded(host)
    change(host)
    out = host()
    assert out["current"] is False
    assert len(out["reasons"]) == 1 and out["reasons"][0].startswith(str(host.tmp)) and \
        out["reasons"][0].endswith(reason), out["reasons"]


def test_data_under_a_stat_only_path_is_not_a_difference(host):
    recorded(host)
    (host.spool / "state").write_text("new state\n")
    (host.spool / "more").write_text("x")
    assert host()["current"] is True


def test_a_unit_state_is_a_difference(host):
    recorded(host)
    host.units.write_text(json.dumps({"munge": "loaded/inactive/enabled", "slurmd": "loaded/active/enabled"}))
    assert host()["reasons"] == ["unit munge is loaded/inactive/enabled (was loaded/active/enabled)"]
    host.units.write_text(json.dumps({"munge": "loaded/active/enabled", "slurmd": "loaded/active/disabled"}))
    assert host()["reasons"] == ["unit slurmd is loaded/active/disabled (was loaded/active/enabled)"]


def test_a_machine_without_the_hook_is_a_difference(host):
    recorded(host)
    (host.etc / "slurm" / "slurm.conf").write_text("x\n")
    out = host(held=False)
    assert out["current"] is False
    assert out["reasons"][0] == "the Machine lacks the deletion hook" and out["reasons"][1].endswith("slurm.conf changed")


def test_check_mode_writes_and_removes_nothing(host):
    out = host(state="present", check_mode=True)
    assert out["changed"] is True and not host.stamp.exists()
    recorded(host)
    (host.etc / "slurm" / "slurm.conf").write_text("x\n")
    assert host(state="present", check_mode=True)["changed"] is True
    assert host()["current"] is False  # the old stamp is still there
    assert host(state="absent", check_mode=True)["changed"] is True and host.stamp.exists()
    assert host(state="absent")["changed"] is True and not host.stamp.exists()
    assert host(state="absent")["changed"] is False


def test_a_relative_path_fails_naming_it(host):
    out = host(trees=["etc/slurm"])
    assert out["failed"] and out["msg"] == "trees: etc/slurm is not an absolute path"
    assert not host.stamp.exists()


def test_a_damaged_stamp_counts_as_none(host):
    recorded(host)
    host.stamp.write_text("{not json")
    assert host()["reasons"][0].startswith("no stamp")


# scontrol show node --oneliner as slurmctld 22.05 prints it (a lab node; the OS field holds spaces)
RECORD = ("NodeName=%s Arch=x86_64 CoresPerSocket=2  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.95 AvailableFeatures=compute "
          "ActiveFeatures=compute Gres=(null) NodeAddr=10.89.90.21 NodeHostName=%s Version=22.05.8 OS=Linux 6.1.0 #1 "
          "SMP PREEMPT_DYNAMIC @0  RealMemory=2000 AllocMem=0 FreeMem=22667 Sockets=1 Boards=1 %sState=IDLE+DYNAMIC_NORM "
          "ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=compute CfgTRES=cpu=2,mem=2000M,billing=2")

FAKE_SCONTROL = r'''#!/usr/bin/env python3
import os, sys
assert sys.argv[1:] == ["show", "node", "--oneliner"], sys.argv
text = open(os.environ["FAKE_RECORDS"]).read()
if text.startswith("ERROR "):
    sys.stderr.write(text[6:])
    sys.exit(1)
sys.stdout.write(text)
'''


@pytest.fixture
def slurmctld(host):
    """host, with a stand-in scontrol whose records come from a file; records(**{node: MemSpecLimit or None})."""
    (host.tmp / "bin" / "scontrol").write_text(FAKE_SCONTROL)
    (host.tmp / "bin" / "scontrol").chmod(0o755)
    path = host.tmp / "records"

    def records(**nodes):
        path.write_text("".join(RECORD % (n, n, "" if limit is None else "MemSpecLimit=%d " % limit) + "\n"
                                for n, limit in nodes.items()))

    def run(**params):
        return run_module("converge_state", dict({"digest": "d1", "trees": [str(host.etc / "slurm")],
                                                  "stamp": str(host.stamp)}, **params),
                          host.tmp / "bin", FAKE_RECORDS=str(path))

    run.records, run.path = records, path
    run(state="present")
    return run


def test_a_node_record_as_declared_is_no_difference(slurmctld):
    slurmctld.records(**{"cn-01": 256, "cn-02": None})
    out = slurmctld(slurm_nodes={"cn-01": 256, "cn-02": 0})
    assert out["current"] is True and out["reasons"] == []


def test_a_memspeclimit_lost_by_slurmctld_or_a_missing_record_is_a_difference(slurmctld):
    # slurmctld 22.05 restarted: the dynamic node's record no longer shows the MemSpecLimit it registered with
    slurmctld.records(**{"cn-01": None, "cn-03": 128})
    out = slurmctld(slurm_nodes={"cn-01": 256, "cn-02": 0, "cn-03": "512"})
    assert out["current"] is False
    assert out["reasons"] == ["node cn-01's record has MemSpecLimit 0, it declares 256", "Slurm has no record of node cn-02",
                              "node cn-03's record has MemSpecLimit 128, it declares 512"]


def test_records_that_cannot_be_read_are_a_difference(slurmctld):
    slurmctld.path.write_text("ERROR slurm_load_node error: Unable to contact slurm controller (connect failure)\n")
    out = slurmctld(slurm_nodes={"cn-01": 256})
    assert out["current"] is False
    assert out["reasons"] == ["Slurm's node records could not be read: slurm_load_node error: Unable to contact slurm "
                              "controller (connect failure)"]
    assert slurmctld()["current"] is True  # no node named: slurmctld is not asked


def test_a_memspeclimit_that_is_not_a_number_fails_naming_it(slurmctld):
    slurmctld.records(**{"cn-01": 256})
    out = slurmctld(slurm_nodes={"cn-01": "256M"})
    assert out["failed"] and out["msg"] == "slurm_nodes: a MemSpecLimit is a whole number of MiB (cn-01: '256M')"
