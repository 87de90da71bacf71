"""Slurm 24.11 -> 26.05 in Slurm's order, on a cluster with jobs running through each step.

A lab of its own (Debian 13, Slurm 24.11): two controllers in HA (LAB_HA=1: keepalived's VIP, the Slurm state on a
shared volume), two compute nodes joining at boot, a login node, the accounting database on a host of its own
(LAB_ACCOUNTING_HOST=1) whose data disk holds the database and its dumps, Slurm without cgroups (LAB_CGROUPS=0,
as the forky hosts it moves to run it). make test runs step 1 (marked gate); make test-all every step.

1. slurmdbd: the database dumped and the dump checked (playbooks/accounting_backup.yml); the host reinstalled with
   Debian forky (Slurm 26.05, MariaDB 11.8), its data disk kept; meanwhile slurmctld 24.11 keeps its messages for
   slurmdbd and a job ends; site.yml starts slurmdbd 26.05, which converts the database, and names step 2.
2. the controllers: the standby reinstalled with forky (the shared state kept); site.yml refuses two controller
   releases naming playbooks/upgrade_controllers.yml, which converges the standby, stops the primary's 24.11 and
   hands control to the 26.05 standby (the outage printed); the primary reinstalled with forky and site.yml: it
   takes control back, and the check names step 3.
3. the compute nodes: playbooks/rollout.yml rolls the compute MachineDeployment (its Machines join at boot,
   LAB_COMPUTE_JOIN_AT_BOOT) to a template whose image is forky's (?suite=forky: the host agent boots that
   release), a job running on an old node through it; meanwhile 24.11 slurmd and 26.05 slurmd serve one 26.05
   controller; site.yml then names step 4.
4. the login node reinstalled with forky and site.yml: no step left; validate.yml passes on 26.05 (srun on every
   node, MPI through PMI2, a job from the login node, accounting, slurmrestd serving 26.05's REST API version).
Every job is in accounting afterwards, those run through a step COMPLETED 0:0."""

import json
import os
import re
import time

import pytest
from kubernetes import client, config

from labkit import Lab, Poller, has_podman, wait_for

LAB = Lab("ulab", "10.89.98", 16498, ".lab/e2e-upgrade", LAB_COMPUTE="2", LAB_ACCOUNTING_HOST="1",
          LAB_CONTROLLERS="2", LAB_HA="1", LAB_DIRECTORY="0", LAB_CGROUPS="0", LAB_COMPUTE_JOIN_AT_BOOT="1",
          LAB_LOGIN="1")
CTL, CTL2, CN1, CN2, DB = "ulab-ctl-01", "ulab-ctl-02", "ulab-cn-01", "ulab-cn-02", "ulab-db-01"
LOGIN = "ulab-login-01"
NS, INFRA, MD = "metal3", "infrastructure.cluster.x-k8s.io", "ulab-compute"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    figures = os.path.join(LAB.state, "logs", "upgrade-figures.tsv")
    if os.path.exists(figures):
        os.remove(figures)
    yield LAB
    LAB.down()


class ClientView(Poller):
    """What a client on a compute node sees while a playbook runs: squeue asked again 0.25 s after each answer or
    failure (3 s at most each). outage() is the longest time between two answers (from one answer's arrival to
    the next one's: slow answers and failed tries both count; about 0.6 s when nothing is out)."""
    interval = 0.25

    def __init__(self, lab, host):
        super().__init__()
        self.lab, self.host, self.answers, self.failed = lab, host, [], 0

    def sample(self):
        if self.lab.on(self.host, "timeout 3 squeue --noheader --format=%i", check=False).returncode == 0:
            self.answers.append(time.time())
        else:
            self.failed += 1

    def outage(self):
        return max((b - a for a, b in zip(self.answers, self.answers[1:])), default=0.0)


def figure(lab, what, value):
    """One measured figure, for bench/upgrade.py and the run's log."""
    print("upgrade: %s: %s" % (what, value))
    with open(os.path.join(lab.state, "logs", "upgrade-figures.tsv"), "a") as fh:
        fh.write("%s\t%s\n" % (what, value))


def logged(lab, res, name):
    """A playbook run's output kept in the lab's logs (upgrade-<name>.log); returned with its whitespace folded, to
    search."""
    with open(os.path.join(lab.state, "logs", "upgrade-%s.log" % name), "w") as log:
        log.write(res.stdout)
    return " ".join(res.stdout.split())


def sacct(lab, jobs):
    """job id -> (state, exit code) of the jobs' allocations, as slurmdbd has them."""
    out = lab.ask(CTL, "sacct --noheader --parsable2 --allocations --format=JobID,State,ExitCode --jobs=%s"
                  % ",".join(jobs), timeout=60)
    return {f[0]: (f[1], f[2]) for f in (line.split("|") for line in out.splitlines()) if len(f) == 3}


def dbd_release(lab):
    # (the package's version: slurmdbd 26.05 prints its own only with a slurmdbd.conf)
    version = lab.on(DB, "dpkg-query -W -f '${Version}' slurmdbd").stdout.strip()
    return ".".join(version.split(".")[:2])


@pytest.mark.gate
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
    t0 = time.time()
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
    text = logged(lab, res, "step1-site")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "the upgrade 24.11 -> 26.05 is at step 2 of 4, the controllers (behind: %s (24.11)" % CTL in text, \
        text[-4000:]
    assert lab.on(DB, "systemctl is-active slurmdbd").stdout.strip() == "active"
    figure(lab, "step 1: slurmdbd away (reinstalled, then site.yml)", "%.0f s" % (time.time() - t0))
    figure(lab, "step 1: messages slurmctld kept for slurmdbd", queue.group(1))
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
    # a job that runs through both handovers, however long they take on a busy machine: it ends when the test
    # releases it (a file on its node), its time limit only a bound
    release = "/var/tmp/converged-upgrade-step2-release"
    lab.on(CN1, "rm -f %s" % release)
    through = lab.on(CTL, "sbatch --parsable --time=30 --nodelist=%s --wrap 'while [ ! -e %s ]; do sleep 2; done; "
                          "echo through'" % (CN1, release)).stdout.strip()
    wait_for("the long job to run", lambda: lab.job_state(CTL, through) == "RUNNING", 60)
    reinstall(lab, CTL2, "controller")
    assert installed(lab, CTL2, "slurmctld") == "26.05" and installed(lab, CTL, "slurmctld") == "24.11"
    # a plain converge refuses two controller releases, naming the way
    res = lab.playbook("site.yml")
    text = " ".join(res.stdout.split())
    assert res.returncode != 0 and "the controllers would run different Slurm releases" in text \
        and "playbooks/upgrade_controllers.yml" in text, text[-3000:]
    # the handover: the standby converged with 26.05, the primary's 24.11 stopped, control handed
    with ClientView(lab, CN2) as view:
        res = lab.playbook("upgrade_controllers.yml")
    text = logged(lab, res, "step2-handover")
    assert res.returncode == 0, res.stdout[-4000:]
    outage = re.search(r"control handed from %s \(Slurm 24.11\) to %s \(Slurm 26.05\): control out ([0-9.]+) s"
                       % (CTL, CTL2), text)
    assert outage, text[-3000:]
    figure(lab, "step 2: control out in the handover (upgrade_controllers.yml)", "%s s" % outage.group(1))
    figure(lab, "step 2: a compute node's squeue in the handover, the longest between two answers",
           "%.1f s (%d tries failed)" % (view.outage(), view.failed))
    assert "Slurmctld(backup) at %s is UP" % CTL2 in lab.ask(CN2, "scontrol ping")
    assert lab.job_state(CTL2, through) == "RUNNING"
    # a job submitted now runs on a 24.11 node under the 26.05 controller
    after = lab.on(CTL2, "sbatch --parsable --nodelist=%s --wrap 'echo after'" % CN2).stdout.strip()
    wait_for("the job submitted after the handover to end", lambda: lab.job_state(CTL2, after) in ("COMPLETED", None), 120)
    # the primary given 26.05: site.yml starts it, it takes control back (a planned handback: the standby stopped
    # first, then the primary started), the check names step 3; the cluster's JWT key is the one it had (a new one
    # would void every token issued)
    key = lab.on(CTL2, "md5sum /etc/slurm/jwt_hs256.key").stdout.split()[0]
    reinstall(lab, CTL, "controller")
    with ClientView(lab, CN2) as view:
        res = lab.playbook("site.yml")
        wait_for("the primary in control again",
                 lambda: "Slurmctld(primary) at %s is UP" % CTL in lab.ask(CN2, "scontrol ping")
                 and lab.on(CTL, "timeout 5 scontrol show partition", check=False).returncode == 0, 120)
    figure(lab, "step 2: a compute node's squeue as the primary takes control back (site.yml), the longest between "
           "two answers", "%.1f s (%d tries failed)" % (view.outage(), view.failed))
    assert lab.job_state(CTL, through) == "RUNNING", "the job did not run through both handovers"
    assert {lab.on(host, "md5sum /etc/slurm/jwt_hs256.key").stdout.split()[0] for host in (CTL, CTL2, DB)} == {key}
    text = logged(lab, res, "step2-site")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "the upgrade 24.11 -> 26.05 is at step 3 of 4, the compute nodes (behind: %s (24.11), %s (24.11))" \
        % (CN1, CN2) in text, text[-4000:]
    lab.on(CN1, "touch %s" % release)
    wait_for("the job run through the step to end", lambda: lab.job_state(CTL, through) in ("COMPLETED", None), 120)
    jobs = sacct(lab, [through, after])
    assert jobs == {through: ("COMPLETED", "0:0"), after: ("COMPLETED", "0:0")}, jobs


def node_releases(lab):
    """Slurm node name -> the release of its slurmd, as the controller has it."""
    out = lab.ask(CTL, "sinfo --noheader --Node --format='%N %v'")
    return {f[0]: ".".join(f[1].split(".")[:2]) for f in (line.split() for line in out.splitlines()) if len(f) == 2}


class MixedReleases(Poller):
    """When the controller was seen serving 24.11 and 26.05 slurmd together (sinfo every 3 s)."""
    interval = 3.0

    def __init__(self, lab):
        super().__init__()
        self.lab, self.seen = lab, []

    def sample(self):
        res = self.lab.on(CTL, "sinfo --noheader --Node --format='%v'", check=False)
        if res.returncode == 0 and {"24.11", "26.05"} <= {v[:5] for v in res.stdout.split()}:
            self.seen.append(time.time())


def test_the_compute_nodes_by_a_rollout_to_forkys_image_a_job_running_through(lab):
    """Step 3: the compute MachineDeployment rolled (rollout.yml) to a template whose image is Debian forky's; the
    old nodes drained one at a time (a job runs to its end on one), the new ones join at boot with slurmd 26.05
    under the 26.05 controllers, which meanwhile serve 24.11 and 26.05 nodes together."""
    co = client.CustomObjectsApi(config.new_client_from_config(os.path.join(lab.state, "capi", "kubeconfig")))
    base = co.get_namespaced_custom_object(INFRA, "v1beta2", NS, "metal3machinetemplates", MD)
    spec = json.loads(json.dumps(base["spec"]))
    spec["template"]["spec"]["image"]["url"] = spec["template"]["spec"]["image"]["url"].split("?")[0] + "?suite=forky"
    co.create_namespaced_custom_object(INFRA, "v1beta2", NS, "metal3machinetemplates", {
        "apiVersion": INFRA + "/v1beta2", "kind": "Metal3MachineTemplate",
        "metadata": {"name": MD + "-forky", "namespace": NS}, "spec": spec})

    def machines():
        return {m["metadata"]["name"] for m in co.list_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta2", NS, "machines",
            label_selector="cluster.x-k8s.io/deployment-name=" + MD)["items"]}
    old, old_machines = node_releases(lab), machines()
    assert set(old.values()) == {"24.11"} and len(old_machines) == len(old), (old, old_machines)
    through = lab.on(CTL, "sbatch --parsable --time=10 --nodelist=%s --wrap 'sleep 90; echo through'" % CN1).stdout.strip()
    wait_for("the long job to run", lambda: lab.job_state(CTL, through) == "RUNNING", 60)
    with MixedReleases(lab) as mixed:
        t0 = time.time()
        res = lab.sh(*lab.playbook_args("rollout.yml", "converged_rollout_deployment=" + MD,
                                        "converged_rollout_template=%s-forky" % MD, "converged_rollout_join_timeout=300"),
                     check=False, timeout=1800)
        took = time.time() - t0
    logged(lab, res, "step3-rollout")
    assert res.returncode == 0, res.stdout[-5000:]
    figure(lab, "step 3: rollout of %d compute nodes to forky's image (a 90 s job running on one)" % len(old),
           "%.0f s" % took)
    assert mixed.seen, "the controllers were never seen serving 24.11 and 26.05 nodes together"
    # every Machine replaced (a new Machine may get an old one's host, and so its node name), every node on 26.05
    now = node_releases(lab)
    assert len(now) == len(old) and set(now.values()) == {"26.05"}, (old, now)
    assert len(machines()) == len(old_machines) and not machines() & old_machines, (old_machines, machines())
    assert lab.job_state(CTL, through) in ("COMPLETED", None)
    assert sacct(lab, [through]) == {through: ("COMPLETED", "0:0")}
    res = lab.playbook("site.yml")
    text = logged(lab, res, "step3-site")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "the upgrade 24.11 -> 26.05 is at step 4 of 4, the login nodes (behind: %s (24.11))" % LOGIN in text, \
        text[-4000:]


def test_the_login_node_last_then_validate_yml_on_26_05(lab):
    """Step 4: the login node reinstalled with forky and converged; no step left; validate.yml on 26.05."""
    reinstall(lab, LOGIN, "login")
    res = lab.playbook("site.yml")
    text = logged(lab, res, "step4-site")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "is at step" not in text, text[-4000:]
    assert dbd_release(lab) == "26.05" and installed(lab, LOGIN, "slurm-client") == "26.05"
    assert installed(lab, CTL, "slurmctld") == "26.05" and installed(lab, CTL2, "slurmctld") == "26.05"
    assert set(node_releases(lab).values()) == {"26.05"}
    res = lab.playbook("validate.yml")
    text = logged(lab, res, "validate")
    assert res.returncode == 0, res.stdout[-4000:]
    assert re.search(r"MPI \(srun --mpi=pmi2\): [1-9]\d* rank\(s\) reported", text), text[-3000:]
    assert "login nodes: %s submitted job" % LOGIN in text, text[-3000:]
    assert "REST: slurmrestd v0.0.45" in text or "REST: off" in text, text[-3000:]
