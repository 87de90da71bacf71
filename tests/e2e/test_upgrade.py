"""Slurm 24.11 -> 26.05 in Slurm's order, its first step: slurmdbd, on a cluster with a job running through it.

A lab of its own (Debian 13, Slurm 24.11; two compute nodes) with the accounting database on a host of its own (LAB_ACCOUNTING_HOST=1)
whose data disk holds the database and its dumps, and Slurm without cgroups (LAB_CGROUPS=0, as the forky hosts it
moves to run it). The accounting database is dumped and the dump checked (playbooks/accounting_backup.yml); the
host is reinstalled with Debian forky (Slurm 26.05, MariaDB 11.8), its data disk kept, as a site reinstalls its
database host; meanwhile slurmctld 24.11 keeps its messages for slurmdbd and a job ends; site.yml then starts
slurmdbd 26.05, which converts the database, and says where the upgrade is (step 2 of 4, the controllers). Every
job is in accounting afterwards, the one that ran through the step COMPLETED 0:0. The later steps (the controllers
with a takeover, compute by playbooks/rollout.yml, login) are docs/upgrades.md's."""

import os
import re

import pytest

from labkit import Lab, has_podman, wait_for

LAB = Lab("ulab", "10.89.98", 16498, ".lab/e2e-upgrade", LAB_COMPUTE="2", LAB_ACCOUNTING_HOST="1",
          LAB_DIRECTORY="0", LAB_CGROUPS="0")
CTL, CN1, CN2, DB = "ulab-ctl-01", "ulab-cn-01", "ulab-cn-02", "ulab-db-01"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    yield LAB
    LAB.down()


def sacct(lab, jobs):
    """job id -> (state, exit code) of the jobs' allocations, as slurmdbd has them."""
    out = lab.ask(CTL, "sacct --noheader --parsable2 --allocations --format=JobID,State,ExitCode --jobs=%s"
                  % ",".join(jobs), timeout=60)
    return {f[0]: (f[1], f[2]) for f in (line.split("|") for line in out.splitlines()) if len(f) == 3}


def dbd_release(lab):
    # (the package's version: slurmdbd 26.05 prints its own only with a slurmdbd.conf)
    version = lab.on(DB, "dpkg-query -W -f '${Version}' slurmdbd").stdout.strip()
    return ".".join(version.split(".")[:2])


def test_slurmdbd_first_a_checked_dump_the_database_converted_nothing_lost(lab):
    assert lab.slurm_release(CTL) == "24.11" and dbd_release(lab) == "24.11"
    before = lab.on(CTL, "sbatch --parsable --wrap 'echo before'").stdout.strip()
    through = lab.on(CTL, "sbatch --parsable --time=10 --nodelist=%s --wrap 'sleep 100; echo through'" % CN1).stdout.strip()
    wait_for("the jobs to be in accounting", lambda: sacct(lab, [before]).get(before, ("",))[0] == "COMPLETED", 90)
    wait_for("the long job to run", lambda: lab.job_state(CTL, through) == "RUNNING", 60)
    # 1. the checked dump, on the host's data disk
    res = lab.playbook("accounting_backup.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    dumps = lab.on(DB, "ls /var/backups/slurm-accounting").stdout.split()
    assert dumps, res.stdout[-2000:]
    # 2. the host reinstalled with Debian forky (Slurm 26.05), its name, address and data disk kept
    address = lab.on(DB, "hostname -I").stdout.split()[0]
    lab.sh("env", "LAB_SUITE=forky", "python3", "lab/machines.py", "reinstall", DB, address, "accounting")
    assert dbd_release(lab) == "26.05"
    assert lab.on(DB, "ls /var/backups/slurm-accounting").stdout.split() == dumps
    # slurmdbd is down: slurmctld keeps the messages of a job that ends meanwhile
    meanwhile = lab.on(CTL, "sbatch --parsable --nodelist=%s --wrap 'echo meanwhile'" % CN2).stdout.strip()
    wait_for("the job to end", lambda: lab.job_state(CTL, meanwhile) in ("COMPLETED", None), 120)
    queue = re.search(r"DBD Agent queue size: (\d+)", lab.ask(CTL, "sdiag"))
    assert queue and int(queue.group(1)) > 0, "slurmctld holds no message for slurmdbd"
    # 3. site.yml starts slurmdbd 26.05 over the 24.11 database (the dump is recent) and says where the upgrade is
    res = lab.playbook("site.yml")
    with open(os.path.join(lab.state, "logs", "upgrade-step1-site.log"), "w") as log:
        log.write(res.stdout)
    text = " ".join(res.stdout.split())
    assert res.returncode == 0, res.stdout[-4000:]
    assert "the upgrade 24.11 -> 26.05 is at step 2 of 4, the controllers (behind: %s (24.11)" % CTL in text, \
        text[-4000:]
    assert lab.on(DB, "systemctl is-active slurmdbd").stdout.strip() == "active"
    assert "ulab" in lab.ask(CTL, "sacctmgr --noheader show cluster format=cluster")
    # the queue delivered, every job in accounting, the one that ran through the step COMPLETED 0:0
    wait_for("slurmctld's messages to reach slurmdbd",
             lambda: re.search(r"DBD Agent queue size: 0\b", lab.ask(CTL, "sdiag")), 120)
    wait_for("the job run through the step to end", lambda: lab.job_state(CTL, through) in ("COMPLETED", None), 180)
    jobs = sacct(lab, [before, through, meanwhile])
    assert jobs == {before: ("COMPLETED", "0:0"), through: ("COMPLETED", "0:0"), meanwhile: ("COMPLETED", "0:0")}, jobs
