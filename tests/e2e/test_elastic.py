"""Elastic lifecycle end to end in a lab of its own: real machines, real Slurm, the
simulator's Cluster API controller, scale_up.yml and scale_down.yml as AWX runs them.

Order matters (one lab, module scope): 2 -> 4 -> 2 (a long job on a leaving node)
-> drain timeout keeps the hook -> 0 -> 2.
"""

import os
import re
import time

import pytest
from kubernetes import client, config

from labkit import Lab, has_podman

# the lab default munge key source (secret) runs in make lab; this lab generates its key
LAB = Lab("elab", "10.89.80", 16480, ".lab/e2e", LAB_COMPUTE="2", LAB_MUNGE_KEY_SOURCE="generate",
          LAB_DIRECTORY="0")
STATE = LAB.state
sh, on = LAB.sh, LAB.on
CTL = "elab-ctl-01"
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


def scale(n, *extra):
    args = ["python3", "lab/scale.py", str(n)]
    for ev in extra:
        args += ["-e", ev]
    return sh(*args, check=False)


def slurm_nodes():
    out = on(CTL, "sinfo --noheader --Node --format '%N %t'").stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def main_pid(machine, unit):
    return on(machine, "systemctl show -p MainPID --value " + unit).stdout.strip()


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    api = config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig"))
    yield client.CustomObjectsApi(api)
    LAB.down()


def compute_machines(co, deleting=None):
    items = co.list_namespaced_custom_object(G, V, NS, "machines",
                                             label_selector="cluster.x-k8s.io/deployment-name=elab-compute")["items"]
    return [m for m in items if deleting is None or bool(m["metadata"].get("deletionTimestamp")) == deleting]


def hostname(machine):
    return [a["address"] for a in machine["status"]["addresses"] if a["type"] == "Hostname"][0]


def mark_for_deletion(co, machine):
    co.patch_namespaced_custom_object(G, V, NS, "machines", machine["metadata"]["name"],
                                      {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}})


def containers():
    out = sh("podman", "ps", "--filter", "label=converged.hpc.lab=elab", "--format", "{{.Names}}").stdout
    return set(out.split())


def test_scale_up_2_to_4_new_nodes_idle_controller_untouched(lab):
    ctl_pid = main_pid(CTL, "slurmctld")
    old = {n: main_pid(n, "slurmd") for n in ("elab-cn-01", "elab-cn-02")}
    res = scale(4)
    assert res.returncode == 0, res.stdout + res.stderr
    nodes = slurm_nodes()
    assert sorted(nodes) == ["elab-cn-01", "elab-cn-02", "elab-cn-03", "elab-cn-04"], nodes
    assert set(nodes.values()) == {"idle"}
    assert main_pid(CTL, "slurmctld") == ctl_pid  # the controller was not restarted
    assert {n: main_pid(n, "slurmd") for n in old} == old  # nor the existing nodes
    # every compute Machine carries the hook, the new ones too
    assert all(HOOK in m["metadata"].get("annotations", {}) for m in compute_machines(lab))
    assert "new to Slurm" in open(os.path.join(STATE, "logs", "scale_up.log")).read()


def test_scale_down_4_to_2_waits_for_the_running_job(lab):
    victims = sorted(compute_machines(lab, deleting=False), key=hostname)[-2:]
    names = [hostname(m) for m in victims]
    job = on(CTL, "sbatch --parsable --nodelist=%s --output=/tmp/long-%%j.out --wrap 'sleep 25; echo finished'"
             % names[0]).stdout.strip()
    deadline = time.time() + 30
    while "RUNNING" not in on(CTL, "squeue --noheader --job %s --format %%T" % job).stdout:
        assert time.time() < deadline, "the job did not start"
        time.sleep(1)
    for m in victims:
        mark_for_deletion(lab, m)
    started = time.time()
    res = scale(2)
    assert res.returncode == 0, res.stdout + res.stderr
    assert time.time() - started >= 15  # scale-down waited for the job
    state = on(CTL, "scontrol show job %s" % job).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, state
    assert sorted(slurm_nodes()) == ["elab-cn-01", "elab-cn-02"]
    assert not (set(names) & containers())  # the simulator removed the machines, after the job
    remaining = compute_machines(lab)
    assert len(remaining) == 2 and not any(m["metadata"].get("deletionTimestamp") for m in remaining)


def test_drain_timeout_keeps_the_hook_and_names_node_and_job(lab):
    victim = sorted(compute_machines(lab, deleting=False), key=hostname)[-1]
    node = hostname(victim)
    job = on(CTL, "sbatch --parsable --nodelist=%s --wrap 'sleep 120'" % node).stdout.strip()
    deadline = time.time() + 30
    while "RUNNING" not in on(CTL, "squeue --noheader --job %s --format %%T" % job).stdout:
        assert time.time() < deadline
        time.sleep(1)
    mark_for_deletion(lab, victim)
    res = scale(1, "converged_drain_timeout=5")
    assert res.returncode != 0
    log = open(os.path.join(STATE, "logs", "scale_down.log")).read()
    assert re.search(r"node %s still runs job\(s\) %s after 5 s" % (node, job), log), log[-3000:]
    held = lab.get_namespaced_custom_object(G, V, NS, "machines", victim["metadata"]["name"])
    assert HOOK in held["metadata"]["annotations"] and held["status"]["phase"] == "Deleting"
    assert node in containers()
    assert slurm_nodes()[node] == "drng"  # draining: the job goes on, nothing new starts
    assert "RUNNING" in on(CTL, "squeue --noheader --job %s --format %%T" % job).stdout
    # the admin lets the job end (here: cancels it); the next run releases the hook
    on(CTL, "scancel %s" % job)
    res = LAB.playbook("scale_down.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    deadline = time.time() + 120
    while any(m["metadata"]["name"] == victim["metadata"]["name"] for m in compute_machines(lab)):
        assert time.time() < deadline
        time.sleep(1)
    assert node not in slurm_nodes()


def test_a_second_scale_down_waits_for_the_lock(lab):
    # a scale-down run holds the lock: another one waits, and gives up after its lock timeout
    on(CTL, "mkdir /run/converged-hpc-scale-down.lock && echo 'other run' > /run/converged-hpc-scale-down.lock/owner")
    victim = sorted(compute_machines(lab, deleting=False), key=hostname)[-1]
    mark_for_deletion(lab, victim)
    try:
        res = scale(0 if len(compute_machines(lab, deleting=False)) == 1 else 1, "converged_lock_timeout=4")
        assert res.returncode != 0
        log = open(os.path.join(STATE, "logs", "scale_down.log")).read()
        assert "held by: other run" in log
        assert hostname(victim) in slurm_nodes()  # nothing was done without the lock
    finally:
        on(CTL, "rm -rf /run/converged-hpc-scale-down.lock")
    res = LAB.playbook("scale_down.yml")
    assert res.returncode == 0, res.stdout[-3000:]


def test_scale_to_zero_and_back(lab):
    res = scale(0)
    assert res.returncode == 0, res.stdout + res.stderr
    assert slurm_nodes() == {}
    assert "is UP" in on(CTL, "scontrol ping").stdout  # a controller with zero nodes stays up
    res = scale(2)
    assert res.returncode == 0, res.stdout + res.stderr
    nodes = slurm_nodes()
    assert len(nodes) == 2 and set(nodes.values()) == {"idle"}
    job = on(CTL, "sbatch --parsable --wait --nodes=2 --wrap 'srun hostname'").stdout.strip()
    assert "ExitCode=0:0" in on(CTL, "scontrol show job %s" % job).stdout


def test_no_secret_in_any_log(lab):
    import base64
    token = open(os.path.join(STATE, "capi", "token")).read().strip()
    key = on(CTL, "base64 -w0 /etc/munge/munge.key").stdout.strip()  # generated on the controller
    assert len(base64.b64decode(key)) == 1024
    logs = os.path.join(STATE, "logs")
    for name in os.listdir(logs):
        text = open(os.path.join(logs, name), errors="replace").read()
        assert token not in text, name
        assert key[:40] not in text, name
