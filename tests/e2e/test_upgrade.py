"""Slurm 24.11 -> 26.05 in Slurm's order, on a cluster with jobs running through each step.

A lab of its own (Debian 13, Slurm 24.11): two controllers in HA (LAB_HA=1: keepalived's VIP, the Slurm state on a
shared volume), two compute nodes, the accounting database on a host of its own (LAB_ACCOUNTING_HOST=1) whose data
disk holds the database and its dumps, Slurm without cgroups (LAB_CGROUPS=0, as the forky hosts it moves to run it).

1. slurmdbd: the database dumped and the dump checked (playbooks/accounting_backup.yml); the host reinstalled with
   Debian forky (Slurm 26.05, MariaDB 11.8), its data disk kept; meanwhile slurmctld 24.11 keeps its messages for
   slurmdbd and a job ends; site.yml starts slurmdbd 26.05, which converts the database, and names step 2.
2. the controllers: the standby reinstalled with forky (the shared state kept); site.yml refuses two controller
   releases naming playbooks/upgrade_controllers.yml, which converges the standby, stops the primary's 24.11 and
   hands control to the 26.05 standby (the outage printed); the primary reinstalled with forky and site.yml: it
   takes control back, and the check names step 3.
Every job is in accounting afterwards, those run through a step COMPLETED 0:0. Steps 3 (compute by
playbooks/rollout.yml to a forky image) and 4 (login) are docs/upgrades.md's."""

import os
import re

import pytest

from labkit import Lab, has_podman, wait_for

LAB = Lab("ulab", "10.89.98", 16498, ".lab/e2e-upgrade", LAB_COMPUTE="2", LAB_ACCOUNTING_HOST="1",
          LAB_CONTROLLERS="2", LAB_HA="1", LAB_DIRECTORY="0", LAB_CGROUPS="0")
CTL, CTL2, CN1, CN2, DB = "ulab-ctl-01", "ulab-ctl-02", "ulab-cn-01", "ulab-cn-02", "ulab-db-01"

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


def installed(lab, host, package):
    version = lab.on(host, "dpkg-query -W -f '${Version}' %s" % package).stdout.strip()
    return ".".join(version.split(".")[:2])


def reinstall(lab, host, node_type):
    """host made again from Debian forky's image (Slurm 26.05), its name, address and data disks kept."""
    address = lab.on(host, "hostname -I").stdout.split()[0]
    lab.sh("env", "LAB_SUITE=forky", "python3", "lab/machines.py", "reinstall", host, address, node_type)


def test_the_controllers_one_takeover_of_outage_then_the_primary_takes_control_back(lab):
    """Step 2 with HA: the standby given 26.05 (reinstalled, the shared state volume kept), site.yml refusing two
    controller releases and naming the playbook, upgrade_controllers.yml handing control to it with a job running,
    then the primary given 26.05 and site.yml: it takes control back, and the check names step 3."""
    assert dbd_release(lab) == "26.05", "step 1 (the test before) did not leave slurmdbd on 26.05"
    through = lab.on(CTL, "sbatch --parsable --time=10 --nodelist=%s --wrap 'sleep 150; echo through'" % CN1).stdout.strip()
    wait_for("the long job to run", lambda: lab.job_state(CTL, through) == "RUNNING", 60)
    reinstall(lab, CTL2, "controller")
    assert installed(lab, CTL2, "slurmctld") == "26.05" and installed(lab, CTL, "slurmctld") == "24.11"
    # a plain converge refuses two controller releases, naming the way
    res = lab.playbook("site.yml")
    text = " ".join(res.stdout.split())
    assert res.returncode != 0 and "the controllers would run different Slurm releases" in text \
        and "playbooks/upgrade_controllers.yml" in text, text[-3000:]
    # the handover: the standby converged with 26.05, the primary's 24.11 stopped, control handed
    res = lab.playbook("upgrade_controllers.yml")
    with open(os.path.join(lab.state, "logs", "upgrade-step2-handover.log"), "w") as log:
        log.write(res.stdout)
    text = " ".join(res.stdout.split())
    assert res.returncode == 0, res.stdout[-4000:]
    outage = re.search(r"control handed from %s \(Slurm 24.11\) to %s \(Slurm 26.05\): control out ([0-9.]+) s"
                       % (CTL, CTL2), text)
    assert outage, text[-3000:]
    print("upgrade: controllers 24.11 -> 26.05, control out %s s in the handover" % outage.group(1))
    assert "Slurmctld(backup) at %s is UP" % CTL2 in lab.ask(CN2, "scontrol ping")
    # a job submitted now runs on a 24.11 node under the 26.05 controller
    after = lab.on(CTL2, "sbatch --parsable --nodelist=%s --wrap 'echo after'" % CN2).stdout.strip()
    wait_for("the job submitted after the handover to end", lambda: lab.job_state(CTL2, after) in ("COMPLETED", None), 120)
    assert lab.job_state(CTL2, through) == "RUNNING"
    # the primary given 26.05: site.yml starts it, it takes control back, the check names step 3
    reinstall(lab, CTL, "controller")
    res = lab.playbook("site.yml")
    with open(os.path.join(lab.state, "logs", "upgrade-step2-site.log"), "w") as log:
        log.write(res.stdout)
    text = " ".join(res.stdout.split())
    assert res.returncode == 0, res.stdout[-4000:]
    assert "the upgrade 24.11 -> 26.05 is at step 3 of 4, the compute nodes (behind: %s (24.11), %s (24.11))" \
        % (CN1, CN2) in text, text[-4000:]
    wait_for("the primary in control again", lambda: "Slurmctld(primary) at %s is UP" % CTL in lab.ask(CN2, "scontrol ping")
             and lab.on(CTL, "timeout 5 scontrol show partition", check=False).returncode == 0, 120)
    wait_for("the job run through the step to end", lambda: lab.job_state(CTL, through) in ("COMPLETED", None), 240)
    jobs = sacct(lab, [through, after])
    assert jobs == {through: ("COMPLETED", "0:0"), after: ("COMPLETED", "0:0")}, jobs
