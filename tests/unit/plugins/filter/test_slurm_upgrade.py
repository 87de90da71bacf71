"""The Slurm release rules (module_utils/slurm_release.py) and the upgrade decision (filter
slurm_upgrade_check) on what converged.hpc.slurm_versions reads: a fresh cluster, a supported upgrade in
its order, 22.05 to 24.11 in place refused with the ways out, state loss allowed only with the queue empty,
the order of an upgrade, and a slurmdbd upgrade waiting for an accounting dump."""

import struct

import pytest

from ansible_collections.converged.hpc.plugins.filter.slurm_upgrade import slurm_upgrade_check
from ansible_collections.converged.hpc.plugins.module_utils import slurm_release as rel
from ansible_collections.converged.hpc.plugins.modules import slurm_versions


def versions(installed=None, running=None, steps=0, state=None, backup_age=None):
    base = dict.fromkeys(("slurmctld", "slurmd", "slurmdbd", "client"))
    return {"installed": dict(base, **(installed or {})),
            "running": dict(dict.fromkeys(("slurmctld", "slurmd", "slurmdbd")), **(running or {})),
            "job_steps": steps, "state": {"files": ["job_state"] if state else [], "release": state},
            "backup_age": backup_age}


def controller(name, installed, running=None, **kw):
    v = {"slurmctld": installed, "slurmdbd": installed, "client": installed}
    run = {"slurmctld": running, "slurmdbd": running} if running else {}
    return {"host": name, "roles": ["controller", "slurmdbd"], "versions": versions(v, run, **kw)}


def compute(name, installed, running=None, steps=0):
    run = {"slurmd": running} if running else {}
    return {"host": name, "roles": ["compute"],
            "versions": versions({"slurmd": installed, "client": installed}, run, steps)}


def test_the_release_rules():
    assert rel.release_of("slurm 24.11.5") == "24.11" and rel.release_of("22.05.8") == "22.05"
    assert rel.release_of("") is None and rel.release_of(None) is None
    assert rel.takes_over("24.11", "23.02") and rel.takes_over("24.11", "24.05") and rel.takes_over("24.11", "24.11")
    assert not rel.takes_over("24.11", "22.05") and not rel.takes_over("23.11", "21.08")
    # two before 24.11 (24.05 takes 23.11 and 23.02, not 22.05), three from it (the upgrade guide's table)
    assert not rel.takes_over("24.05", "22.05") and rel.takes_over("24.05", "23.02")
    assert rel.takes_over("23.11", "22.05") and not rel.takes_over("23.11", "21.08")
    assert rel.oldest_supported("24.11") == "23.02" and rel.oldest_supported("23.11") == "22.05"
    assert rel.oldest_supported("24.05") == "23.02" and rel.oldest_supported("26.05") == "24.11"
    assert [r for r in rel.RELEASES if rel.takes_over("26.05", r) and r != "26.05"] == ["24.11", "25.05", "25.11"]
    assert rel.takes_over("26.05", "24.11") and not rel.takes_over("26.05", "24.05")
    assert not rel.takes_over("26.05", "22.05") and rel.steps("22.05", "26.05") == ["23.11", "25.05"]
    assert rel.steps("22.05", "24.11") == ["23.11"] and rel.steps("23.11", "24.11") == []
    assert rel.steps("24.11", "26.05") == [] and rel.steps("20.11", "25.11") == ["22.05", "23.11", "25.05"]
    # releases after the table follow its pattern (May, November)
    assert rel.ordinal("26.05") == rel.ordinal("25.11") + 1 and rel.ordinal("26.11") == rel.ordinal("25.11") + 2
    assert rel.takes_over("26.11", "25.05") and not rel.takes_over("27.05", "25.05")


def test_a_fresh_cluster_or_one_that_runs_what_it_has_is_fine():
    fresh = [controller("ctl", "24.11.5"), compute("cn-01", "24.11.5"), compute("cn-02", "24.11.5")]
    assert slurm_upgrade_check(fresh)["errors"] == []
    running = [controller("ctl", "22.05.8", "22.05.8", state="22.05"), compute("cn-01", "22.05.8", "22.05.8", 3)]
    out = slurm_upgrade_check(running)
    assert out["errors"] == [] and "cn-01 slurmd 22.05" in out["now"] and "ctl saved state 22.05" in out["now"]


def test_2205_to_2411_in_place_is_refused_naming_both_releases_and_the_ways_out():
    # the controller's machine came back with a 24.11 image; the compute nodes run 22.05, a job among them
    hosts = [controller("ctl", "24.11.5"), compute("cn-01", "22.05.8", "22.05.8", steps=1),
             compute("cn-02", "22.05.8", "22.05.8")]
    errors = slurm_upgrade_check(hosts)["errors"]
    takeover = [e for e in errors if e.startswith("slurmctld 24.11 on ctl cannot take over")]
    assert len(takeover) == 1, errors
    message = takeover[0]
    assert "the Slurm 22.05 that runs now (cn-01 (slurmd 22.05), cn-02 (slurmd 22.05))" in message
    assert "reads state and RPCs from 23.02 and later only" in message and "1 job step(s) running" in message
    assert "22.05 -> 23.11 -> 24.11" in message and "converged_slurm_allow_state_loss=true" in message
    assert any("slurmd 22.05 on cn-01 is too old for the controllers' slurmctld 24.11" in e for e in errors)
    # the state the old controller saved, with nothing running any more
    alone = [controller("ctl", "24.11.5", state="22.05"), compute("cn-01", "24.11.5")]
    (error,) = slurm_upgrade_check(alone)["errors"]
    assert "cannot take over the Slurm 22.05 that runs now (ctl (saved state 22.05))" in error


def test_state_loss_is_allowed_only_when_asked_and_no_job_runs():
    hosts = [controller("ctl", "24.11.5", state="22.05"), compute("cn-01", "24.11.5")]
    out = slurm_upgrade_check(hosts, allow_state_loss=True)
    assert out["errors"] == [] and "allowed (allow_state_loss, no job running)" in out["notes"][0]
    busy = [controller("ctl", "24.11.5", state="22.05"), compute("cn-01", "24.11.5", "22.05.8", steps=2)]
    out = slurm_upgrade_check(busy, allow_state_loss=True)
    assert any("cannot take over" in e and "2 job step(s) running" in e for e in out["errors"]), out


def test_a_supported_upgrade_goes_in_its_order():
    # 23.11 -> 24.11: slurmdbd first (its dump fresh), then the controllers, then the nodes
    dbd_first = [{"host": "db", "roles": ["slurmdbd"],
                  "versions": versions({"slurmdbd": "24.11.5"}, {"slurmdbd": "23.11.10"}, backup_age=600)},
                 {"host": "ctl", "roles": ["controller"],
                  "versions": versions({"slurmctld": "23.11.10"}, {"slurmctld": "23.11.10"}, state="23.11")},
                 compute("cn-01", "23.11.10", "23.11.10", steps=1)]
    assert slurm_upgrade_check(dbd_first)["errors"] == []
    # no recent dump: the database waits for one
    stale = [dict(dbd_first[0], versions=versions({"slurmdbd": "24.11.5"}, {"slurmdbd": "23.11.10"},
                                                  backup_age=3 * 86400))] + dbd_first[1:]
    (error,) = slurm_upgrade_check(stale)["errors"]
    assert "slurmdbd on db would restart from 23.11 into 24.11" in error and "accounting_backup.yml" in error
    assert "the newest dump is 72 h old" in error
    none = [dict(dbd_first[0], versions=versions({"slurmdbd": "24.11.5"}, {"slurmdbd": "23.11.10"}))] + dbd_first[1:]
    assert "no dump found" in slurm_upgrade_check(none)["errors"][0]
    # the controllers before slurmdbd: refused
    db = versions({"slurmdbd": "23.11.10"}, {"slurmdbd": "23.11.10"})
    ctl = versions({"slurmctld": "24.11.5"}, {"slurmctld": "23.11.10"})
    ctld_first = [{"host": "db", "roles": ["slurmdbd"], "versions": db},
                  {"host": "ctl", "roles": ["controller"], "versions": ctl}]
    (error,) = slurm_upgrade_check(ctld_first)["errors"]
    assert error.startswith("slurmctld 24.11 would report to slurmdbd 23.11 on db: slurmdbd is upgraded first")


@pytest.mark.parametrize("newer", ["compute", "login"])
def test_a_node_or_client_newer_than_the_controllers_is_refused(newer):
    # a Machine template rolled to a new image: its new Machine joins with a newer Slurm
    hosts = [controller("ctl", "23.11.10", "23.11.10")]
    if newer == "compute":
        hosts.append(compute("cn-new", "24.11.5"))
        what = "slurmd 24.11 on cn-new"
    else:
        hosts.append({"host": "login-01", "roles": ["login"], "versions": versions({"client": "24.11.5"})})
        what = "client commands 24.11 on login-01"
    (error,) = slurm_upgrade_check(hosts)["errors"]
    assert error.startswith(what + " is newer than the controllers' slurmctld 23.11"), error


def test_controllers_of_different_releases_are_refused():
    hosts = [controller("ctl-01", "24.11.5"), controller("ctl-02", "23.11.10")]
    errors = slurm_upgrade_check(hosts)["errors"]
    assert any("the controllers would run different Slurm releases" in e for e in errors), errors


def test_the_state_files_header_names_the_release_that_wrote_it(tmp_path):
    def header(kind, protocol):
        name = kind.encode() + b"\0"
        return struct.pack(">I", len(name)) + name + struct.pack(">H", protocol) + b"\0" * 8

    (tmp_path / "job_state").write_bytes(header("PROTOCOL_VERSION", 38 << 8))
    (tmp_path / "node_state").write_bytes(header("PROTOCOL_VERSION", 42 << 8))
    (tmp_path / "garbage").write_bytes(b"\xff" * 10)
    assert slurm_versions.state_release(str(tmp_path / "job_state")) == "22.05"
    assert slurm_versions.state_release(str(tmp_path / "node_state")) == "24.11"
    assert slurm_versions.state_release(str(tmp_path / "garbage")) is None
    assert slurm_versions.state_release(str(tmp_path / "missing")) is None


def test_a_downgrade_is_refused_naming_the_way_through():
    # the backup reinstalled with 26.05 took control and saved its state; the primary still has 24.11
    hosts = [controller("ctl-01", "24.11.5", state="26.05"), controller("ctl-02", "26.05.5", running="26.05.5")]
    errors = " ".join(slurm_upgrade_check(hosts)["errors"])
    assert "slurmctld 24.11 on ctl-01 would go back from the Slurm 26.05 that runs now" in errors
    assert "Slurm does not downgrade" in errors and "install Slurm 26.05 again on ctl-01" in errors
    # a slurmdbd older than the one that converted the database
    dbd = {"host": "db-01", "roles": ["slurmdbd"],
           "versions": versions({"slurmdbd": "24.11.5"}, {"slurmdbd": "26.05.5"})}
    errors = " ".join(slurm_upgrade_check([dbd])["errors"])
    assert "slurmdbd 24.11 on db-01 would go back from the Slurm 26.05" in errors
    assert "restore the accounting database from the dump" in errors


def test_every_refusal_names_the_step_the_upgrade_is_at():
    db = {"host": "db-01", "roles": ["slurmdbd"], "versions": versions({"slurmdbd": "26.05.5"}, {"slurmdbd": "26.05.5"})}
    ctl = {"host": "ctl-01", "roles": ["controller"],
           "versions": versions({"slurmctld": "24.11.5", "client": "24.11.5"}, {"slurmctld": "24.11.5"})}
    login = {"host": "login-01", "roles": ["login"], "versions": versions({"client": "26.05.5"})}
    out = slurm_upgrade_check([db, ctl, login])
    assert out["step"]["number"] == 2 and out["step"]["name"] == "controllers"
    assert out["step"]["from"] == "24.11" and out["step"]["to"] == "26.05"
    assert out["step"]["pending"] == ["ctl-01 (24.11)"]
    # the login node ahead of its controllers is refused, and the refusal says where the upgrade is
    assert any("client commands 26.05 on login-01 is newer than the controllers" in e
               and e.endswith("the upgrade 24.11 -> 26.05 is at step 2 of 4, the controllers (behind: ctl-01 (24.11))")
               for e in out["errors"]), out["errors"]
    # the controllers done: step 3, the compute nodes (a 24.11 slurmd under 26.05 controllers is allowed)
    ctl26 = {"host": "ctl-01", "roles": ["controller"],
             "versions": versions({"slurmctld": "26.05.5", "client": "26.05.5"}, {"slurmctld": "26.05.5"})}
    out = slurm_upgrade_check([db, ctl26, compute("cn-01", "24.11.5", "24.11.5")])
    assert out["errors"] == [] and out["step"]["number"] == 3 and out["step"]["pending"] == ["cn-01 (24.11)"]
    # nothing behind: no upgrade under way
    assert slurm_upgrade_check([db, ctl26])["step"]["number"] == 0


def test_the_controllers_handover_hands_control_to_the_standby_given_the_newer_release():
    from ansible_collections.converged.hpc.plugins.filter.slurm_upgrade import slurm_controller_handover
    dbd = {"host": "db", "roles": ["slurmdbd"], "versions": versions({"slurmdbd": "26.05.5"}, {"slurmdbd": "26.05.5"})}
    ctl1 = {"host": "ctl-01", "roles": ["controller"],
            "versions": versions({"slurmctld": "24.11.5"}, {"slurmctld": "24.11.5"}, state="24.11")}
    ctl2 = {"host": "ctl-02", "roles": ["controller"], "versions": versions({"slurmctld": "26.05.5"})}
    order = ["ctl-01", "ctl-02"]
    plan = slurm_controller_handover([ctl1, ctl2, dbd], order)
    assert plan["errors"] == [] and plan["target"] == "ctl-02" and plan["old"] == ["ctl-01"], plan
    assert plan["text"] == "control handed from ctl-01 (Slurm 24.11) to ctl-02 (Slurm 26.05)"
    # site.yml in the handover lets the standby start 26.05 next to 24.11; without it, refused naming the playbook
    hosts = [ctl1, ctl2, dbd]
    out = slurm_upgrade_check(hosts, handover=order)
    assert out["errors"] == [] and any("for the handover (playbooks/upgrade_controllers.yml)" in n
                                       for n in out["notes"]), out
    (error,) = slurm_upgrade_check(hosts)["errors"]
    assert "the controllers would run different Slurm releases" in error and "upgrade_controllers.yml" in error
    # done: both on 26.05
    ctl1_new = {"host": "ctl-01", "roles": ["controller"], "versions": versions({"slurmctld": "26.05.5"})}
    done = slurm_controller_handover([ctl1_new, ctl2, dbd], order)
    assert done["done"] and done["errors"] == [] and "nothing to hand over" in done["text"]


def test_a_handover_is_refused_naming_the_way_when_it_is_unsafe():
    from ansible_collections.converged.hpc.plugins.filter.slurm_upgrade import slurm_controller_handover
    order = ["ctl-01", "ctl-02"]
    old = {"host": "ctl-02", "roles": ["controller"], "versions": versions({"slurmctld": "24.11.5"}, {"slurmctld": "24.11.5"})}
    new_primary = {"host": "ctl-01", "roles": ["controller"], "versions": versions({"slurmctld": "26.05.5"})}
    (error,) = slurm_controller_handover([new_primary, old], order)["errors"]
    assert error.startswith("ctl-01 (the primary, SlurmctldHost[0]) has Slurm 26.05 while ctl-02 has 24.11"), error
    assert "The primary goes last" in error
    # slurmdbd first
    dbd = {"host": "db", "roles": ["slurmdbd"], "versions": versions({"slurmdbd": "24.11.5"}, {"slurmdbd": "24.11.5"})}
    ctl1 = {"host": "ctl-01", "roles": ["controller"], "versions": versions({"slurmctld": "24.11.5"}, {"slurmctld": "24.11.5"})}
    ctl2 = {"host": "ctl-02", "roles": ["controller"], "versions": versions({"slurmctld": "26.05.5"})}
    (error,) = slurm_controller_handover([ctl1, ctl2, dbd], order)["errors"]
    assert error.startswith("slurmdbd on db is Slurm 24.11: slurmdbd goes first (step 1"), error
    # beyond the window, and one controller alone
    far = {"host": "ctl-01", "roles": ["controller"], "versions": versions({"slurmctld": "22.05.8"}, {"slurmctld": "22.05.8"})}
    (error,) = slurm_controller_handover([far, ctl2], order)["errors"]
    assert "cannot take over the state of slurmctld 22.05" in error and "22.05 -> 23.11 -> 25.05 -> 26.05" in error
    # one controller: whatever it has installed, nothing to hand over (site.yml restarts it)
    alone = slurm_controller_handover([ctl2], ["ctl-02"])
    assert alone["done"] and alone["errors"] == [], alone
    missing = {"host": "ctl-02", "roles": ["controller"], "versions": versions({})}
    (error,) = slurm_controller_handover([ctl1, missing], order)["errors"]
    assert error.startswith("slurmctld is not installed on ctl-02"), error
