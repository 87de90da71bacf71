"""Benchmark: a GPU host moved between a Kubernetes workload cluster and Slurm (playbooks/move.yml), in a lab
of its own: one GPU BareMetalHost in the pool, a Kubernetes worker at the start, a real kube-apiserver as the
workload cluster's API (needs $KUBEBUILDER_ASSETS: make kube-assets). The lab runs on the real Cluster API,
CAPM3 and Bare Metal Operator; Cluster API drains the worker's Node itself.

Each round moves the host Kubernetes -> Slurm with a GPU job waiting (drained by Cluster API, deprovisioned,
claimed by the Slurm gpu MachineDeployment, booted, joined to Slurm by scale_up.yml in the same run: timed until
the job is RUNNING and until the run ends), then
Slurm -> Kubernetes (drained through our hook by scale_down.yml, deprovisioned, claimed by the workers,
booted, its Node registered). Printed per move, each figure measured, none derived from others: the run's wall
time; move.yml's own timestamps - planning, the source letting go, deprovisioning (Ironic's cleaning, held
--deprovision-seconds by the host agent), claim and boot (Metal3's and the machine's: a container here, Ironic's
provisioning on real hardware); and, towards Slurm, what the benchmark sees on the controller every 0.2 s: when
the node first registered with Slurm and when the waiting job was RUNNING (both from move.yml's start), and the
time between the two (the controller scheduling the job once the node is there).

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
                LAB_DEPROVISION_SECONDS=str(deprovision), LAB_JOIN_AT_BOOT="0",
                CONTAINERS_CONF=os.path.join(REPO, "lab", "containers.conf"),
                ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))


def run(environ, *cmd):
    proc = subprocess.run(list(cmd), cwd=REPO, env=environ, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (" ".join(cmd), proc.stdout[-3000:], proc.stderr[-2000:]))
    return proc.stdout


def seen(environ, job):
    """(the job's state, whether the pool's host is a Slurm node), in one exec on the controller."""
    out = subprocess.run(["podman", "exec", NAME + "-ctl-01", "bash", "-c",
                          "squeue -h -j %s -o %%T; echo; sinfo -h -N -o %%N -n %s-bm-01" % (job, NAME)], env=environ,
                         capture_output=True, text=True, check=False).stdout
    state, nodes = (out.split("\n\n", 1) + [""])[:2]
    return state.strip() or "DONE", bool(nodes.strip())


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
    running = registered = None
    while proc.poll() is None or (job and running is None and time.monotonic() - t0 < 600):
        if job and running is None:
            state, node = seen(environ, job)
            now = time.monotonic() - t0
            if node and registered is None:
                registered = now
            if state in ("RUNNING", "COMPLETING", "DONE"):
                running = now
                registered = now if registered is None else registered  # (it ran there: it was registered)
        time.sleep(0.2)
    wall = time.monotonic() - t0
    log.close()
    out = open(os.path.join(STATE, "logs", "bench-move.log")).read()
    found = LINE.search(out)
    if proc.returncode != 0 or not found:
        sys.exit("move.yml failed or said no 'moved ...' line:\n" + out[-3000:])
    total, planned, let_go, deprovisioning, booted = (float(found.group(i)) for i in range(4, 9))
    return {"direction": "%s -> %s" % (source, target), "wall": wall, "running": running, "move": total,
            "planned": planned, "let_go": let_go, "deprovisioning": deprovisioning, "booted": booted,
            "registered": registered, "to_run": running - registered if running is not None else None}


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


def figure(value):
    return "%.1f" % value if value is not None else "-"


def report(management, rows):
    slurm, kube = NAME + "-gpu", NAME + "-k8s-gpu"
    head = ("direction (%s)" % management, "wall", "job RUN", "planned", "let go", "deprov", "claim+boot",
            "node reg", "reg->RUN")
    print("%-34s %6s %8s %8s %7s %7s %10s %8s %8s" % head)
    for r in rows:
        print("%-34s %6.1f %8s %8.1f %7.1f %7.1f %10.1f %8s %8s" % (
            r["direction"] + (" (at boot)" if r.get("variant") else ""), r["wall"], figure(r["running"]), r["planned"],
            r["let_go"], r["deprovisioning"], r["booted"], figure(r["registered"]), figure(r["to_run"])))
    for variant in ("scale_up.yml", "join at boot"):
        for direction in (kube + " -> " + slurm, slurm + " -> " + kube):
            mine = [r for r in rows if r["direction"] == direction and r.get("variant", "scale_up.yml") == variant]
            if mine:
                summary(management + ", " + variant, direction, mine)


def summary(management, direction, mine):
    """Medians of what was measured: move.yml's own steps, and towards Slurm the node's registration and the job."""
    def median(key):
        return statistics.median(r[key] for r in mine)
    towards_slurm = all(r["running"] is not None for r in mine)
    print("%s median %s: wall %.1f s; planned %.1f s, the source let go %.1f s, deprovisioning %.1f s, claimed and "
          "booted %.1f s%s" % (
              management, direction, median("wall"), median("planned"), median("let_go"), median("deprovisioning"),
              median("booted"), "; the node registered at %.1f s, the waiting GPU job RUNNING at %.1f s (%.1f s after "
              "the registration)" % (median("registered"), median("running"), median("to_run")) if towards_slurm else ""))


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
