"""Benchmark: a GPU host moved between a Kubernetes workload cluster and Slurm (playbooks/move.yml), in a lab
of its own: one GPU BareMetalHost in the pool, a Kubernetes worker at the start, a real kube-apiserver as the
workload cluster's API (needs $KUBEBUILDER_ASSETS: make kube-assets). The lab runs on the real Cluster API,
CAPM3 and Bare Metal Operator; Cluster API drains the worker's Node itself.

Each round moves the host Kubernetes -> Slurm with a GPU job waiting (drained by Cluster API, deprovisioned,
claimed by the Slurm gpu MachineDeployment, booted, joined to Slurm by scale_up.yml in the same run: timed until
the job is RUNNING and until the run ends), then
Slurm -> Kubernetes (drained through our hook by scale_down.yml, deprovisioned, claimed by the workers,
booted, its Node registered). Printed per move: the run's wall time, and move.yml's own breakdown - planning,
the source letting go, deprovisioning (Ironic's cleaning, held --deprovision-seconds by the host agent), claim and boot
- and the collection's part: the time to the job RUNNING (or to the end) less deprovisioning and the claim and
boot (Metal3's and the machine's: a container here, Ironic's provisioning on real hardware).

    python3 bench/move.py [--rounds 3] [--deprovision-seconds 5] [--join-at-boot] [--keep]

A GPU host joins Slurm through scale_up.yml in the same run; with --join-at-boot the same lab then moves it as
many rounds more with the Slurm gpu MachineDeployment joining at boot (converged_join_at_boot, its bootstrap
data written by join_at_boot.yml and named by its template; the pool's GPU hosts named ahead in gres.conf by
the gpu node type's gres_nodes): move.yml waits for the node to register by itself and converges nothing.

The reference work measured 184 s for Kubernetes -> Slurm on real hardware, 145.2 s of it Ironic's
deprovisioning and 38.7 s provisioning from a prebuilt image: the lab's boot (a container) is not that.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "mvbench"
STATE = os.path.join(REPO, ".lab", "mvbench")
LINE = re.compile(r"moved (\S+) from (\S+) to (\S+) in ([\d.]+) s: planned in ([\d.]+) s, the source let go in "
                  r"([\d.]+) s, deprovisioning ([\d.]+) s, claimed and booted in ([\d.]+) s")


def env(deprovision):
    return dict(os.environ, LAB_NAME=NAME, LAB_SUBNET_PREFIX="10.89.84",
                LAB_API_PORT="16484", LAB_STATE=".lab/mvbench",
                LAB_FLAVOUR="prebaked", LAB_CONTROLLERS="1", LAB_COMPUTE="0", LAB_GPU="0", LAB_DIRECTORY="0",
                LAB_BARE_METAL="1", LAB_BARE_METAL_GPU="1", LAB_KUBERNETES_GPU="1",
                LAB_DEPROVISION_SECONDS=str(deprovision),
                CONTAINERS_CONF=os.path.join(REPO, "lab", "containers.conf"),
                ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))


def run(environ, *cmd):
    proc = subprocess.run(list(cmd), cwd=REPO, env=environ, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (" ".join(cmd), proc.stdout[-3000:], proc.stderr[-2000:]))
    return proc.stdout


def job_state(environ, job):
    out = subprocess.run(["podman", "exec", NAME + "-ctl-01", "squeue", "-h", "-j", job, "-o", "%T"], env=environ,
                         capture_output=True, text=True, check=False).stdout.strip()
    return out or "DONE"


def move(environ, source, target, to_slurm):
    """One move.yml run; towards Slurm with a GPU job waiting, timed until it is RUNNING."""
    job = None
    if to_slurm:
        job = run(environ, "podman", "exec", NAME + "-ctl-01", "sbatch", "--parsable", "-p", "gpu", "-N1",
                  "--gres=gpu:1", "--wrap", "sleep 1").strip()
    log = open(os.path.join(STATE, "logs", "bench-move.log"), "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(["ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"),
                             "playbooks/move.yml", "-e",
                             json.dumps({"converged_move": {"from": source, "to": target, "count": 1}})],
                            cwd=REPO, env=environ, stdout=log, stderr=subprocess.STDOUT)
    running = None
    while proc.poll() is None or (job and running is None and time.monotonic() - t0 < 600):
        if job and running is None and job_state(environ, job) in ("RUNNING", "COMPLETING", "DONE"):
            running = time.monotonic() - t0
        time.sleep(0.2)
    wall = time.monotonic() - t0
    log.close()
    out = open(os.path.join(STATE, "logs", "bench-move.log")).read()
    found = LINE.search(out)
    if proc.returncode != 0 or not found:
        sys.exit("move.yml failed or said no 'moved ...' line:\n" + out[-3000:])
    total, planned, let_go, deprovisioning, booted = (float(found.group(i)) for i in range(4, 9))
    end = running if running is not None else wall
    return {"direction": "%s -> %s" % (source, target), "wall": wall, "running": running, "move": total,
            "planned": planned, "let_go": let_go, "deprovisioning": deprovisioning, "booted": booted,
            "join": wall - total, "ours": end - deprovisioning - booted}


def join_at_boot(environ):
    """The Slurm gpu MachineDeployment's new Machines join at their first boot, as a site sets it."""
    with open(os.path.join(STATE, "group_vars", "all", "join-at-boot.yml"), "w") as fh:
        fh.write("converged_join_at_boot: [%s-gpu]\n" % NAME)
    run(environ, "ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"), "playbooks/join_at_boot.yml")
    run(environ, "python3", "-c", "import sys; from kubernetes import client, config; client.CustomObjectsApi("
        "config.new_client_from_config(sys.argv[1])).patch_namespaced_custom_object('cluster.x-k8s.io', 'v1beta2', "
        "'metal3', 'machinedeployments', sys.argv[2], {'spec': {'template': {'spec': {'bootstrap': {"
        "'dataSecretName': sys.argv[2] + '-join'}}}}})", os.path.join(STATE, "capi", "kubeconfig"), NAME + "-gpu")


def bench(args, management):
    """The lab up on management, args.rounds moves each way; the rows."""
    environ = env(args.deprovision_seconds)
    run(environ, "lab/lab.sh", "down")
    t0 = time.monotonic()
    run(environ, "lab/lab.sh", "up")
    run(environ, "lab/lab.sh", "mgmt")
    run(environ, "lab/lab.sh", "converge")
    print("%s: lab up and converged in %.1f s (1 GPU host, a Kubernetes worker; deprovisioning %.1f s)"
          % (management, time.monotonic() - t0, args.deprovision_seconds), flush=True)
    slurm, kube = NAME + "-gpu", NAME + "-k8s-gpu"
    rows = []
    try:
        for dummy in range(args.rounds):
            rows.append(move(environ, kube, slurm, True))
            rows.append(move(environ, slurm, kube, False))
        if args.join_at_boot:
            join_at_boot(environ)
            for dummy in range(args.rounds):
                rows.append(dict(move(environ, kube, slurm, True), variant="join at boot"))
                rows.append(dict(move(environ, slurm, kube, False), variant="join at boot"))
    finally:
        if not args.keep:
            run(environ, "lab/lab.sh", "down")
    return rows


def report(management, rows):
    slurm, kube = NAME + "-gpu", NAME + "-k8s-gpu"
    head = ("direction (%s)" % management, "wall", "job RUN", "planned", "let go", "deprov", "claim+boot", "join",
            "ours")
    print("%-34s %6s %8s %8s %7s %7s %10s %6s %6s" % head)
    for r in rows:
        print("%-34s %6.1f %8s %8.1f %7.1f %7.1f %10.1f %6.1f %6.1f" % (
            r["direction"] + (" (at boot)" if r.get("variant") else ""), r["wall"], "%.1f" % r["running"] if r["running"] is not None else "-", r["planned"],
            r["let_go"], r["deprovisioning"], r["booted"], r["join"], r["ours"]))
    for variant in ("scale_up.yml", "join at boot"):
        for direction in (kube + " -> " + slurm, slurm + " -> " + kube):
            mine = [r for r in rows if r["direction"] == direction and r.get("variant", "scale_up.yml") == variant]
            if mine:
                summary(management + ", " + variant, direction, mine)


def summary(management, direction, mine):
    print("%s median %s: wall %.1f s%s; the collection's part (to the end%s, less deprovisioning and the "
          "claim and boot) %.1f s" % (
              management, direction, statistics.median(r["wall"] for r in mine),
              ", the waiting GPU job RUNNING at %.1f s" % statistics.median(r["running"] for r in mine)
              if mine[0]["running"] is not None else "",
              " or the job RUNNING" if mine[0]["running"] is not None else "",
              statistics.median(r["ours"] for r in mine)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deprovision-seconds", type=float, default=5)
    ap.add_argument("--keep", action="store_true", help="leave the (last) lab up")
    ap.add_argument("--join-at-boot", action="store_true",
                    help="then as many rounds with the Slurm gpu MachineDeployment joining at boot")
    args = ap.parse_args()
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        sys.exit("bench/move.py needs $KUBEBUILDER_ASSETS (make kube-assets) for the servers")
    run(env(args.deprovision_seconds), "make", "-s", "dev-collection")
    report("real", bench(args, "real"))


if __name__ == "__main__":
    main()
