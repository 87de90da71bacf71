"""Slurm 22.05 (Debian 12, LAB_SUITE=bookworm) still works, and an upgrade that would lose jobs is
refused, in a lab of its own: the main job (site.yml, validate.yml), a second converge that changes
nothing, a scale 1 -> 2 -> 1 with a job running on the leaving node (COMPLETED 0:0), then the
controller's machine reprovisioned with the Debian 13 image (Slurm 24.11, the way a Cluster API
template rolled to a new image replaces a host) while a job runs: site.yml refuses before any change,
naming both releases and the ways out; the job runs on, the compute node's slurmd is untouched, the
new controller's slurmctld is not started. Every playbook here runs on the oldest ansible-core the collection
claims (meta/runtime.yml; a venv of tests/ansible_core.sh): the oldest Slurm and the oldest Ansible together, as
a site with an older execution environment runs them (tests/matrix.sh runs the unit and sanity tests on each
release)."""

import os
import re

import pytest
from kubernetes import client, config

from labkit import Lab, ansible_core_path, has_podman, oldest_ansible_core, wait_for

# two compute hosts: the scale-up claims the second
LAB = Lab("rlab", "10.89.92", 16492, ".lab/e2e-releases", LAB_SUITE="bookworm", LAB_COMPUTE="1",
          LAB_DIRECTORY="0", LAB_COMPUTE_HOSTS="2")
# the same lab's machines from the Debian 13 image (Slurm 24.11)
TRIXIE = Lab("rlab", "10.89.92", 16492, ".lab/e2e-releases", LAB_SUITE="trixie", LAB_COMPUTE="1", LAB_DIRECTORY="0")
sh, on = LAB.sh, LAB.on
CTL, CN1 = "rlab-ctl-01", "rlab-cn-01"
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.env["PATH"] = ansible_core_path(oldest_ansible_core())
    LAB.up()
    api = config.new_client_from_config(os.path.join(LAB.state, "capi", "kubeconfig"))
    yield client.CustomObjectsApi(api)
    LAB.down()


def job_state(job):
    return LAB.job_state(CTL, job)


def slurm_nodes():
    out = LAB.ask(CTL, "sinfo --noheader --Node --format '%N %t'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_slurm_2205_converges_and_validates(lab):
    # on the oldest ansible-core claimed
    assert "[core %s." % oldest_ansible_core() in LAB.sh("ansible-playbook", "--version").stdout
    assert LAB.slurm_release(CTL) == "22.05" and LAB.slurm_release(CN1) == "22.05"
    log = open(os.path.join(LAB.state, "logs", "validate.log")).read()
    assert "REST: slurmrestd v0.0.38" in log and "a wrong token refused (500)" in log, log[-3000:]
    assert re.search(r"sbatch job \d+ over compute: exit code 0", log)


def test_a_second_converge_on_2205_changes_nothing(lab):
    # the roles themselves, every task again (the fast path off): the 22.05 branches are idempotent too
    res = LAB.playbook("site.yml", "converged_skip_unchanged=false")
    assert res.returncode == 0, res.stdout[-3000:]
    recap = res.stdout[res.stdout.rindex("PLAY RECAP"):]
    assert len(re.findall(r"changed=0 ", recap)) >= 2 and not re.search(r"changed=[1-9]", recap), recap


def test_scale_1_2_1_with_a_job_on_the_leaving_node(lab):
    waiting = on(CTL, "sbatch --parsable --nodes=2 --wrap hostname").stdout.strip()
    res = sh("python3", "lab/scale.py", "2", check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    # the job that waited for the new node ran once it registered: 22.05's scontrol on a configless node
    # (the ready script) asked slurmctld to schedule
    wait_for("the waiting job to complete", lambda: job_state(waiting) == "COMPLETED", 120)
    log = on("rlab-cn-02", "journalctl -t converged-hpc-slurmd-ready --no-pager").stdout
    assert re.search(r"rlab-cn-02 registered [A-Z]+\+DYNAMIC_NORM: scheduling asked through partition\(s\) compute",
                     log), log
    assert slurm_nodes() == {"rlab-cn-01": "idle", "rlab-cn-02": "idle"}
    job = on(CTL, "sbatch --parsable --nodelist=rlab-cn-02 --wrap 'sleep 15; echo finished'").stdout.strip()
    wait_for("the job to run", lambda: job_state(job) == "RUNNING", 60)
    leaving = [m for m in lab.list_namespaced_custom_object(G, V, NS, "machines")["items"]
               if any(a["address"] == "rlab-cn-02" for a in m["status"].get("addresses", []))]
    lab.patch_namespaced_custom_object(G, V, NS, "machines", leaving[0]["metadata"]["name"],
                                       {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}})
    res = sh("python3", "lab/scale.py", "1", check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert slurm_nodes() == {"rlab-cn-01": "idle"}
    out = on(CTL, "scontrol show job %s" % job).stdout
    assert "JobState=COMPLETED" in out and "ExitCode=0:0" in out, out


def test_an_upgrade_from_2205_to_2411_in_place_is_refused_and_nothing_changes(lab):
    job = on(CTL, "sbatch --parsable --nodelist=rlab-cn-01 --wrap 'sleep 600'").stdout.strip()
    wait_for("the job to run", lambda: job_state(job) == "RUNNING", 60)
    slurmd = on(CN1, "systemctl show -p MainPID --value slurmd").stdout.strip()
    # the controller's machine comes back with the Debian 13 image (Slurm 24.11): same name and address
    address = on(CTL, "hostname -I").stdout.split()[0]
    sh("podman", "rm", "-f", CTL)
    TRIXIE.sh("python3", "lab/machines.py", "start", CTL, address, "controller")
    TRIXIE.sh("python3", "lab/machines.py", "ready", CTL, address)
    assert LAB.slurm_release(CTL) == "24.11"
    res = LAB.playbook("site.yml")
    text = " ".join(res.stdout.split())
    assert res.returncode != 0, res.stdout[-3000:]
    assert "slurmctld 24.11 on %s cannot take over the Slurm 22.05 that runs now (%s (slurmd 22.05))" % (CTL, CN1) \
        in text, text[-4000:]
    assert "Nothing was changed" in text and "22.05 -> 23.11 -> 24.11" in text
    assert "converged_slurm_allow_state_loss=true" in text and "1 job step(s) running" in text
    # refused before any change: no role ran on any host
    assert "TASK [converged.hpc." not in res.stdout.split("The Slurm releases, before anything changes")[-1]
    # the job runs on, under the same slurmd; the new controller's slurmctld was never started
    assert on(CN1, "systemctl show -p MainPID --value slurmd").stdout.strip() == slurmd
    assert on(CN1, "pgrep -f 'sleep 600'", check=False).returncode == 0
    assert on(CTL, "systemctl is-active slurmctld", check=False).stdout.strip() != "active"
