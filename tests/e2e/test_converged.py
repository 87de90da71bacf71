"""One pool of bare metal for a Kubernetes workload cluster and Slurm, end to end in a lab of its own:
real Slurm, the real Cluster API, CAPM3 and Bare Metal Operator with a pool of one GPU BareMetalHost, and a
real kube-apiserver as the workload cluster's API (its Nodes and Pods are real objects; the lab's host agent
plays the kubelets, and Cluster API follows and drains the worker's Node itself).

The lab starts with the GPU host a Kubernetes worker (plab-k8s-gpu) and Slurm's gpu partition empty
(plab-gpu at 0). Order matters (one lab, module scope): bad moves are refused with nothing changed; a
GPU job waiting in Slurm brings the idle worker to Slurm (rebalance.yml, the policy) and runs on it;
a Pending GPU Pod does not take the host while a job runs on it, and takes it once the job has ended;
a move by hand killed between the scale-down and the scale-up is finished by the next run; a job
running on a host asked to move keeps running to its end, and the host moves after; a move killed either
way is finished by reconcile.yml.
"""

import base64
import json
import os
import re
import signal
import subprocess

import pytest
import yaml
from kubernetes import client, config

from labkit import REPO, Lab, has_podman, wait_for

LAB = Lab("plab", "10.89.83", 16483, ".lab/e2e-converged", LAB_COMPUTE="0", LAB_DIRECTORY="0", LAB_GPU="0",
          LAB_BARE_METAL="1", LAB_BARE_METAL_GPU="1", LAB_KUBERNETES_GPU="1", LAB_DEPROVISION_SECONDS="3",
          LAB_LEAST_PRIVILEGE="1", LAB_JOIN_AT_BOOT="0")
STATE = LAB.state
on = LAB.on
CTL = "plab-ctl-01"
HOST = "plab-bm-01"
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
SLURM_MD, KUBE_MD = "plab-gpu", "plab-k8s-gpu"
POOL = "converged.hpc/pool"
INTENT = "converged.hpc/move"
PAIR = {"slurm": SLURM_MD, "kubernetes": KUBE_MD, "partition": "gpu", "resource": "nvidia.com/gpu", "cooldown": 0}

pytestmark = [pytest.mark.skipif(not has_podman(), reason="needs podman"),
              pytest.mark.skipif(not os.environ.get("KUBEBUILDER_ASSETS"),
                                 reason="the workload cluster's API needs $KUBEBUILDER_ASSETS (make kube-assets)")]


class World:
    def __init__(self):
        self.co = client.CustomObjectsApi(config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig")))
        self.core = client.CoreV1Api(config.new_client_from_config(
            os.path.join(STATE, "capi", "workload", "kubeconfig")))

    def md(self, name):
        return self.co.get_namespaced_custom_object(G, V, NS, "machinedeployments", name)

    def replicas(self):
        return self.md(SLURM_MD)["spec"]["replicas"], self.md(KUBE_MD)["spec"]["replicas"]

    def host(self):
        return self.co.get_namespaced_custom_object("metal3.io", "v1alpha1", NS, "baremetalhosts", HOST)

    def side(self):
        return self.host()["metadata"]["labels"][POOL]

    def intent(self):
        return (self.md(KUBE_MD)["metadata"].get("annotations") or {}).get(INTENT) \
            or (self.md(SLURM_MD)["metadata"].get("annotations") or {}).get(INTENT)

    def nodes(self):
        return {n.metadata.name: n for n in self.core.list_node().items}

    def snapshot(self):
        """What a refused move must leave as it was."""
        return self.replicas(), self.side(), self.intent(), sorted(self.nodes()), slurm_nodes()


@pytest.fixture(scope="module")
def world():
    LAB.up()
    with open(os.path.join(STATE, "group_vars", "all", "e2e.yml"), "w") as fh:
        fh.write("converged_lease_duration: 10\n")  # a killed run's Lease lapses in 10 s
    path = os.path.join(STATE, "group_vars", "all", "rebalance.yml")
    with open(path) as fh:
        written = yaml.safe_load(fh)
    # the lab's pair, and its workload API; the pair moves without a cooldown here
    assert [dict(p, cooldown=0) for p in written["converged_rebalance_pairs"]] == [PAIR], written
    with open(path, "w") as fh:
        yaml.safe_dump(dict(written, converged_rebalance_pairs=[PAIR]), fh)
    w = World()
    w.core.create_namespaced_service_account("default", {"metadata": {"name": "default"}}) \
        if not w.core.list_namespaced_service_account("default").items else None
    yield w
    LAB.down()


def slurm_nodes():
    out = LAB.ask(CTL, "sinfo --noheader --Node --format '%N %P %t'")
    return sorted(tuple(line.split()) for line in out.splitlines() if line.strip())


def job_state(job):
    out = LAB.ask(CTL, "scontrol show job --oneliner %s" % job, timeout=60,
                  accept=lambda res: "Invalid job id" in res.stdout + res.stderr)
    state, code = re.search(r"JobState=(\S+)", out), re.search(r"ExitCode=(\S+)", out)
    return (state.group(1) if state else None, code.group(1) if code else "")


def gpu_job(seconds=1):
    return on(CTL, "sbatch --parsable -p gpu -N1 --gres=gpu:1 --output=/tmp/gpu-%%j.out "
                   "--wrap 'echo host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES; sleep %d'" % seconds).stdout.strip()


def playbook(name, *extra):
    return LAB.playbook(name, *extra)


def figures(line):
    with open(os.path.join(STATE, "logs", "move-figures.txt"), "a") as fh:
        fh.write(line + "\n")


def decisions(out):
    return "\n".join(line for line in out.splitlines() if "rebalance " in line or "move" in line)


def moved_line(out):
    found = re.search(r"moved \S+ from \S+ to \S+ in [^\"]+", out)
    return found.group(0) if found else ""


@pytest.mark.gate
def test_the_host_starts_as_a_kubernetes_worker(world):
    assert world.replicas() == (0, 1) and world.side() == KUBE_MD
    node = world.nodes()[HOST]
    assert node.status.capacity["nvidia.com/gpu"] == "2"
    assert slurm_nodes() == []


@pytest.mark.gate
def test_bad_moves_are_refused_before_any_change(world):
    before = world.snapshot()
    # a host without the hardware the target's node type selects (compute takes hosts without a GPU)
    res = playbook("move.yml", json.dumps({"converged_move": {"from": KUBE_MD, "to": "plab-compute", "count": 1}}))
    assert res.returncode != 0
    assert "host %s labelled %s=plab-compute is not one plab-compute's hostSelector claims" % (HOST, POOL) \
        in res.stdout, res.stdout[-3000:]
    unknown = {"converged_move": {"from": KUBE_MD, "to": SLURM_MD, "hosts": ["plab-bm-09"]}}
    res = playbook("move.yml", json.dumps(unknown))
    assert res.returncode != 0 and "host plab-bm-09 is not one of metal3/%s's (%s)" % (KUBE_MD, HOST) in res.stdout
    res = playbook("rebalance.yml", json.dumps({"converged_rebalance_pairs": [dict(PAIR, partition="debug")]}))
    assert res.returncode != 0 and "Slurm has no partition 'debug'" in res.stdout, res.stdout[-3000:]
    assert world.snapshot() == before


@pytest.mark.gate
def test_a_gpu_job_waiting_in_slurm_brings_the_idle_worker_over(world):
    job = gpu_job()
    wait_for("the job pending", lambda: job_state(job)[0] == "PENDING", 30)
    # the policy keeps a side's minimum: with one worker to keep, nothing moves
    res = playbook("rebalance.yml", json.dumps({"converged_rebalance_pairs": [dict(PAIR, min_kubernetes=1)]}))
    assert res.returncode == 0, res.stdout[-3000:]
    assert "slurm waits but kubernetes has no idle host above its minimum 1" in res.stdout, res.stdout[-3000:]
    assert world.replicas() == (0, 1)
    res = playbook("rebalance.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "moving %s from %s to %s" % (HOST, KUBE_MD, SLURM_MD) in res.stdout, res.stdout[-3000:]
    figures("Kubernetes -> Slurm (rebalance.yml): " + moved_line(res.stdout))
    wait_for("the GPU job done", lambda: job_state(job)[0] == "COMPLETED", 60)
    assert job_state(job) == ("COMPLETED", "0:0")
    out = on(CTL, "scontrol show job %s | grep -o 'NodeList=[^ ]*'" % job).stdout
    assert "NodeList=%s" % HOST in out
    assert world.replicas() == (1, 0) and world.side() == SLURM_MD and world.intent() is None
    assert HOST not in world.nodes()  # the worker's Node is gone from the workload cluster


@pytest.mark.gate
def test_a_pending_pod_takes_the_host_only_once_its_job_has_ended(world):
    job = gpu_job(900)  # it runs as long as the test needs it to (a rebalance run on a loaded machine: a minute)
    wait_for("the job running", lambda: job_state(job)[0] == "RUNNING", 60)
    world.core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
        "spec": {"automountServiceAccountToken": False, "containers": [{
            "name": "train", "image": "registry.invalid/cuda:12", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    res = playbook("rebalance.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "kubernetes waits but slurm has no idle host above its minimum 0" in res.stdout, res.stdout[-3000:]
    assert world.replicas() == (1, 0) and job_state(job)[0] == "RUNNING"
    on(CTL, "scancel %s" % job)  # the job ends
    wait_for("the job ended", lambda: job_state(job)[0] == "CANCELLED", 60)
    wait_for("the node idle", lambda: slurm_nodes() == [(HOST, "gpu", "idle")], 60, explain=lambda: str(slurm_nodes()))
    res = playbook("rebalance.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "moving %s from %s to %s" % (HOST, SLURM_MD, KUBE_MD) in res.stdout, decisions(res.stdout)
    figures("Slurm -> Kubernetes (rebalance.yml): " + moved_line(res.stdout))
    assert job_state(job)[0] == "CANCELLED"
    node = world.nodes()[HOST]  # the Pod's node is there, with the GPUs it asks for
    assert node.status.allocatable["nvidia.com/gpu"] == "2"
    assert world.replicas() == (0, 1) and slurm_nodes() == [] and world.intent() is None
    world.core.delete_namespaced_pod("train", "default", grace_period_seconds=0)


def killed_once_the_source_let_go(world, request, source_index, log_name):
    """move.yml started with request and killed as soon as the source's replicas are lowered."""
    args = ["ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"), "playbooks/move.yml",
            "-e", json.dumps({"converged_move": request})]
    with open(os.path.join(STATE, "logs", log_name), "w") as log:
        proc = subprocess.Popen(args, cwd=REPO, env=LAB.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            wait_for("the source giving its host back",
                     lambda: world.replicas()[source_index] == 0 or proc.poll() is not None, 120, poll=0.2)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert world.replicas() == (0, 0), "the run ended before it could be killed mid-way"


def test_a_move_killed_between_scale_down_and_scale_up_is_finished_by_the_next_run(world):
    killed_once_the_source_let_go(world, {"from": KUBE_MD, "to": SLURM_MD, "label": "gpu=true"}, 1,
                                  "move-killed.log")
    assert json.loads(world.intent())["hosts"] == [HOST]
    res = playbook("move.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "finishing the move a run left: move %s: %s 1 -> 0, %s 0 -> 1" % (HOST, KUBE_MD, SLURM_MD) in res.stdout
    figures("Kubernetes -> Slurm, finished by the next run after a kill: " + moved_line(res.stdout))
    assert world.replicas() == (1, 0) and world.side() == SLURM_MD and world.intent() is None
    assert slurm_nodes() == [(HOST, "gpu", "idle")]


def test_a_job_running_on_a_host_asked_to_move_ends_first(world):
    job = gpu_job(20)
    wait_for("the job running", lambda: job_state(job)[0] == "RUNNING", 60)
    res = playbook("move.yml", json.dumps({"converged_move": {"from": SLURM_MD, "to": KUBE_MD, "count": 1}}))
    assert res.returncode == 0, res.stdout[-4000:]
    figures("Slurm -> Kubernetes with a 20 s job running (move.yml): " + moved_line(res.stdout))
    assert job_state(job) == ("COMPLETED", "0:0")
    assert world.replicas() == (0, 1) and HOST in world.nodes() and slurm_nodes() == []
    # the second run of the same request has nothing to move: the source has no host left
    again = playbook("move.yml", json.dumps({"converged_move": {"from": SLURM_MD, "to": KUBE_MD, "count": 1}}))
    assert again.returncode != 0 and "metal3/%s has 0 host(s) to move, 1 asked" % SLURM_MD in again.stdout


def source_machines_deleting(world, source):
    """Every Machine of the source MachineDeployment is being deleted (or gone)."""
    machines = world.co.list_namespaced_custom_object(
        G, V, NS, "machines", label_selector="cluster.x-k8s.io/deployment-name=" + source)["items"]
    return all(m["metadata"].get("deletionTimestamp") for m in machines)


def finished_by_reconcile(world, source, target, source_index, log_name):
    """One host's move from source to target killed once the source let go, then one reconcile.yml that
    says it finishes it. It runs once Cluster API has started deleting the source's Machine, as the event path's
    reconcile would (that deletion's event starts it): before that, a Slurm Machine is not yet leaving, and the
    run would leave its host to the next one (on a loaded machine, the lowered replicas take seconds to become a
    deletion)."""
    killed_once_the_source_let_go(world, {"from": source, "to": target, "count": 1}, source_index, log_name)
    wait_for("Cluster API deleting the Machine of %s" % source, lambda: source_machines_deleting(world, source), 120)
    res = playbook("reconcile.yml")
    with open(os.path.join(STATE, "logs", log_name.replace(".log", "-reconcile.log")), "w") as fh:
        fh.write(res.stdout + res.stderr)
    said = [line.strip() for line in res.stdout.splitlines() if "reconcile: " in line]
    assert res.returncode == 0, res.stdout[-4000:]
    assert "reconcile: finishing the move a run left: move %s: %s 1 -> 0, %s 0 -> 1" % (
        HOST, source, target) in res.stdout, said
    assert world.replicas()[1 - source_index] == 1, (world.replicas(), said)


def test_a_move_killed_either_way_is_finished_by_reconcile(world):
    """The level-triggered reconcile (what the event path runs) finishes a move a run left: from Kubernetes
    to Slurm the hosts are labelled and the target raised, and the next reconcile (the new Machine's events
    start one) joins the node; from Slurm, the Machine still held by our hook is drained and released by the
    same run's scale-down first."""
    finished_by_reconcile(world, KUBE_MD, SLURM_MD, 1, "move-killed-k8s.log")
    assert world.replicas() == (1, 0) and world.side() == SLURM_MD and world.intent() is None
    res = playbook("reconcile.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    assert re.search(r"reconcile: join (?!none)", res.stdout), res.stdout[-4000:]
    assert slurm_nodes() == [(HOST, "gpu", "idle")]

    finished_by_reconcile(world, SLURM_MD, KUBE_MD, 0, "move-killed-slurm.log")
    assert world.replicas() == (0, 1) and world.side() == KUBE_MD and world.intent() is None
    assert HOST in world.nodes() and slurm_nodes() == []
    # nothing is left: the next reconcile has nothing to do
    res = playbook("reconcile.yml")
    assert res.returncode == 0 and "reconcile: nothing to do" in res.stdout, res.stdout[-4000:]


@pytest.mark.gate
def test_a_gpu_host_moved_to_slurm_joins_at_its_first_boot_and_the_waiting_job_runs_on_it(world):
    """The Slurm GPU MachineDeployment joins at boot, as a site sets it: converged_join_at_boot names it,
    join_at_boot.yml writes its bootstrap data, its template names that Secret. The pool's GPU hosts are named
    ahead (the gpu node type's gres_nodes), so the controllers' gres.conf has the host's line before it is
    Slurm's; the move waits for the node to register by itself and converges nothing."""
    assert world.replicas() == (0, 1) and world.side() == KUBE_MD  # the previous test gave the host back
    gres = on(CTL, "cat /etc/slurm/gres.conf").stdout
    assert "NodeName=%s Name=gpu Type=lab File=/dev/nvidia[0-1]" % HOST in gres, gres  # ahead, no node yet
    with open(os.path.join(STATE, "group_vars", "all", "join-at-boot.yml"), "w") as fh:
        fh.write("converged_join_at_boot: [%s]\n" % SLURM_MD)
    res = playbook("join_at_boot.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    mgmt = client.CoreV1Api(config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig")))
    value = base64.b64decode(mgmt.read_namespaced_secret(SLURM_MD + "-join", NS).data["value"]).decode()
    assert "Gres=gpu:lab:2" in value and "[ -e /dev/nvidia1 ]" in value, value[-2000:]
    world.co.patch_namespaced_custom_object(G, V, NS, "machinedeployments", SLURM_MD, {"spec": {"template": {
        "spec": {"bootstrap": {"dataSecretName": SLURM_MD + "-join"}}}}})
    job = gpu_job()
    wait_for("the job pending", lambda: job_state(job)[0] == "PENDING", 30)
    res = playbook("rebalance.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    assert "moving %s from %s to %s" % (HOST, KUBE_MD, SLURM_MD) in res.stdout, decisions(res.stdout)
    assert "joined Slurm at their first boot: %s" % HOST in res.stdout, res.stdout[-4000:]
    assert "new to Slurm:" not in res.stdout  # scale_up.yml did not run: nothing was converged
    figures("Kubernetes -> Slurm, joining at boot (rebalance.yml): " + moved_line(res.stdout))
    wait_for("the GPU job done", lambda: job_state(job)[0] == "COMPLETED", 60)
    assert job_state(job) == ("COMPLETED", "0:0")
    out = on(CTL, "scontrol show job %s | grep -o 'NodeList=[^ ]*'" % job).stdout
    assert "NodeList=%s" % HOST in out
    assert "host=%s gpus=0" % HOST in on(HOST, "cat /tmp/gpu-%s.out" % job).stdout
    record = on(CTL, "scontrol show node --oneliner %s" % HOST).stdout
    assert "Gres=gpu:lab:2 " in record and "AvailableFeatures=gpu" in record, record
    assert "slurmd started as Slurm node %s" % HOST in on(HOST, "journalctl -t converged-hpc-join --no-pager").stdout
    assert re.search(r"%s registered [A-Z]+\+DYNAMIC_NORM: scheduling asked through partition\(s\) gpu" % HOST,
                     on(HOST, "journalctl -t converged-hpc-slurmd-ready --no-pager").stdout)
    # the gres.conf line was there before: the node's own is the same, the file did not change
    assert on(CTL, "cat /etc/slurm/gres.conf").stdout == gres
    assert world.replicas() == (1, 0) and world.side() == SLURM_MD and world.intent() is None
