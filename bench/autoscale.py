"""Benchmark: queue-driven autoscaling in a lab of its own (prebaked image, no compute machine).

The event path runs as in production (ansible-rulebook -r converged.hpc.autoscale: a tick runs
autoscale.yml, Machine events run reconcile.yml); nobody runs a playbook. For each round:

  (a) sbatch -N <n> on an empty cluster -> the job RUNNING (the MachineDeployment grows from 0,
      the Machines are provisioned, the nodes join, Slurm starts the job);
  (b) the job done -> the MachineDeployment back at 0 replicas and the Machines gone
      (idle time + cooldown + the drain and the hook's release).

(a) is also split where its seconds go: the MachineDeployment's replicas raised (the tick and autoscale.yml),
every Machine Provisioned (Cluster API, CAPM3 and the Bare Metal Operator claim and provision the hosts), every
node IDLE in Slurm (the join: reconcile.yml's converge, or the first boot), the job RUNNING (Slurm).

    python3 bench/autoscale.py [--nodes 1,2] [--interval 10] [--idle-time 20] [--join-at-boot] [--keda] [--keep]

--join-at-boot runs the same rounds again in the same lab with the compute MachineDeployment joining at
first boot (converged_join_at_boot, its Secret written by join_at_boot.yml and named by its template):
the two ways side by side, on one machine in one run.

--keda runs the same rounds again in the same lab with KEDA v2.21 as the driver (LAB_KEDA=1; make kube-assets
KEDA=1 builds it): the rulebook's tick stopped, playbooks/keda.yml's ScaledObject on the compute
MachineDeployment (max 10, KEDA polling every --interval s, cooldown --idle-time s), its metrics-api trigger
reading slurmrestd; the reconcile rulebook joins and releases the Machines. Both drivers side by side, on one
machine in one run, with the same interval and idle time.

On the real management cluster (kube-apiserver, Cluster API, CAPM3 and the Bare Metal Operator).

The tick interval and idle time bound what is measured: (a) includes up to one interval before
the autoscaler sees the job; (b) includes the idle time and up to one interval.
"""

import argparse
import functools
import os
import re
import subprocess
import sys
import time

from kubernetes import client, config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, LAB_NAME="asbench", LAB_SUBNET_PREFIX="10.89.91", LAB_API_PORT="16491",
           LAB_STATE=".lab/asbench", LAB_FLAVOUR="prebaked", LAB_CONTROLLERS="1", LAB_COMPUTE="0", LAB_DIRECTORY="0",
           LAB_EVENTS_RULEBOOK="autoscale", CONTAINERS_CONF=os.path.join(REPO, "lab", "containers.conf"),
           ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
STATE = os.path.join(REPO, ENV["LAB_STATE"])
CTL, MD, NS = "asbench-ctl-01", "asbench-compute", "metal3"


def sh(*cmd):
    proc = subprocess.run(list(cmd), cwd=REPO, env=ENV, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (" ".join(cmd), proc.stdout[-2000:], proc.stderr[-2000:]))
    return proc.stdout


def on(command):
    return sh("podman", "exec", CTL, "bash", "-c", command)


def wait(what, predicate, timeout=900):
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            sys.exit("%s: not after %d s (log: %s/logs/events.log)" % (what, timeout, ENV["LAB_STATE"]))
        time.sleep(0.5)
    return time.time()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2", help="nodes each round's job asks for")
    ap.add_argument("--interval", type=int, default=10, help="the autoscaler's tick (s)")
    ap.add_argument("--idle-time", type=int, default=20, help="converged_autoscale_idle_time (s)")
    ap.add_argument("--join-at-boot", action="store_true",
                    help="then the same rounds with the MachineDeployment joining at first boot")
    ap.add_argument("--keda", action="store_true", help="then the same rounds with KEDA as the driver")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args()
    if args.keda:
        ENV["LAB_KEDA"] = "1"
    ENV["LAB_AUTOSCALE_INTERVAL"] = str(args.interval)
    # enough compute hosts for the largest round (a real management cluster claims registered hosts)
    ENV["LAB_COMPUTE_HOSTS"] = str(max(int(n) for n in args.nodes.split(",")))
    run(args)


def run(args):
    sh("make", "-s", "dev-collection")
    if args.keda:
        sh("make", "-s", "kube-assets", "KEDA=1")
    sh("lab/lab.sh", "down")
    for step in ("up", "mgmt", "converge"):
        sh("lab/lab.sh", step)
    co = client.CustomObjectsApi(config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig")))
    co.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", NS, "machinedeployments", MD, {"metadata": {
        "annotations": {"cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
                        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "10"}}})
    with open(os.path.join(STATE, "group_vars", "all", "autoscale.yml"), "w") as fh:
        fh.write("converged_autoscale_idle_time: %d\nconverged_autoscale_cooldown: 0\n" % args.idle_time)
    sh("lab/lab.sh", "events")

    def replicas():
        return co.get_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", NS, "machinedeployments",
                                               MD)["spec"]["replicas"]

    def machines():
        return co.list_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", NS, "machines",
                                                label_selector="cluster.x-k8s.io/deployment-name=" + MD)["items"]

    def state(job):
        """(the job's state, the set of nodes IDLE in Slurm), in one exec on the controller."""
        out = on("scontrol show job --oneliner %s || true; echo ---; sinfo -h -N -o '%%N %%t' || true" % job)
        found = re.search(r"JobState=(\S+)", out)
        idle = {line.split()[0] for line in out.split("---", 1)[1].splitlines() if line.strip().endswith(" idle")}
        return (found.group(1) if found else "UNKNOWN"), idle

    def provisioned():
        return [m for m in machines() if (m.get("status") or {}).get("phase") in ("Provisioned", "Running")]

    def join_at_boot():
        """The compute MachineDeployment's new Machines join at their first boot, as a site sets it."""
        with open(os.path.join(STATE, "group_vars", "all", "join-at-boot.yml"), "w") as fh:
            fh.write("converged_join_at_boot: [%s]\n" % MD)
        sh("ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"), "playbooks/join_at_boot.yml")
        co.patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", NS, "machinedeployments", MD, {
            "spec": {"template": {"spec": {"bootstrap": {"dataSecretName": MD + "-join"}}}}})

    def keda():
        """KEDA drives the pool instead of the tick: keda.yml's ScaledObject, the reconcile rulebook."""
        sh("lab/lab.sh", "events-stop")
        with open(os.path.join(STATE, "group_vars", "all", "keda.yml"), "w") as fh:
            fh.write("converged_keda_pools: [{deployment: %s, partition: compute, max: 10, polling: %d, "
                     "cooldown: %d}]\n" % (MD, args.interval, args.idle_time))
        sh("ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"), "playbooks/keda.yml")
        ENV["LAB_EVENTS_RULEBOOK"] = "reconcile"
        sh("lab/lab.sh", "events")

    def running(job, nodes, t0, before, peak, marks):
        """Whether the job runs; marks when the replicas were raised, the Machines Provisioned, the nodes IDLE."""
        count = replicas()
        peak[0] = max(peak[0], count)
        if count and "scaled" not in marks:
            marks["scaled"] = time.time() - t0
        if "provisioned" not in marks and \
                len([m for m in provisioned() if m["metadata"]["name"] not in before]) >= nodes:
            marks["provisioned"] = time.time() - t0
        job_state, idle = state(job)
        if "joined" not in marks and (len(idle) >= nodes or job_state != "PENDING"):
            marks["joined"] = time.time() - t0
        return job_state in ("RUNNING", "COMPLETING", "COMPLETED")

    def completed(job):
        return state(job)[0] == "COMPLETED"

    print("autoscale bench (the real Cluster API, CAPM3 and Bare Metal Operator): tick %d s, idle time %d s, "
          "cooldown 0, prebaked image" % (args.interval, args.idle_time))
    if args.keda:
        print("KEDA v2.21 (metrics-api on slurmrestd's jobs): polling %d s, cooldown %d s, HPA sync 15 s, the HPA's "
              "scale-down stabilization %d s" % (args.interval, args.idle_time, args.idle_time))
    print("sbatch -> RUNNING is split: scaled (replicas raised), provisioned (every Machine Provisioned), "
          "joined (every node IDLE), RUNNING; each from sbatch")
    print("%-10s %-14s %-6s %-8s %-12s %-8s %-22s %-22s %-s" % (
        "driver", "join", "nodes", "scaled", "provisioned", "joined", "sbatch -> RUNNING (s)", "done -> 0 replicas (s)",
        "peak replicas"))
    try:
        variants = [("autoscale", "reconcile.yml")] + ([("autoscale", "at first boot")] if args.join_at_boot else [])
        variants += [("keda", variants[-1][1])] if args.keda else []
        for driver, variant in variants:
            if variant == "at first boot" and driver == "autoscale":
                wait("an empty pool", lambda: replicas() == 0 and not machines())
                join_at_boot()
            if driver == "keda":
                wait("an empty pool", lambda: replicas() == 0 and not machines())
                keda()
            for nodes in [int(n) for n in args.nodes.split(",")]:
                wait("an empty pool", lambda: replicas() == 0 and not machines())
                before = {m["metadata"]["name"] for m in machines()}
                t0 = time.time()
                job = on("sbatch --parsable -N %d --wrap 'sleep 5'" % nodes).strip()
                peak, marks = [0], {}
                t_run = wait("job %s running" % job, functools.partial(running, job, nodes, t0, before, peak, marks))
                t_done = wait("job %s completed" % job, functools.partial(completed, job))
                t_zero = wait("back to 0", lambda: replicas() == 0 and not machines())
                split = ["%.1f" % marks[k] if k in marks else "-" for k in ("scaled", "provisioned", "joined")]
                print("%-10s %-14s %-6d %-8s %-12s %-8s %-22.1f %-22.1f %d" % (
                    driver, variant, nodes, split[0], split[1], split[2], t_run - t0, t_zero - t_done, peak[0]), flush=True)
    finally:
        sh("lab/lab.sh", "events-stop")
        if not args.keep:
            sh("lab/lab.sh", "down")


if __name__ == "__main__":
    main()
