"""Benchmark: a GPU host moved between a Kubernetes workload cluster and Slurm (playbooks/move.yml), in a lab
of its own: one GPU BareMetalHost in the pool, a Kubernetes worker at the start, a real kube-apiserver as the
workload cluster's API (needs $KUBEBUILDER_ASSETS: make kube-assets).

Each round moves the host Kubernetes -> Slurm (drained by Cluster API, deprovisioned, claimed by the Slurm gpu
MachineDeployment, booted, joined to Slurm by scale_up.yml in the same run: it ends with the node IDLE), then
Slurm -> Kubernetes (drained through our hook by scale_down.yml, deprovisioned, claimed by the workers,
booted, its Node registered). Printed per move: the run's wall time, and move.yml's own breakdown - planning,
the source letting go, deprovisioning (the simulated Ironic cleaning: --deprovision-seconds), claim and boot
- and the collection's part: the wall time less deprovisioning.

    python3 bench/move.py [--rounds 3] [--deprovision-seconds 5] [--keep]

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
    return dict(os.environ, LAB_NAME=NAME, LAB_SUBNET_PREFIX="10.89.84", LAB_API_PORT="16484", LAB_STATE=".lab/mvbench",
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


def move(environ, source, target):
    t0 = time.monotonic()
    out = run(environ, "ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"), "playbooks/move.yml",
              "-e", json.dumps({"converged_move": {"from": source, "to": target, "count": 1}}))
    wall = time.monotonic() - t0
    found = LINE.search(out)
    if not found:
        sys.exit("no 'moved ...' line in move.yml's output:\n" + out[-3000:])
    total, planned, let_go, deprovisioning, booted = (float(found.group(i)) for i in range(4, 9))
    return {"direction": "%s -> %s" % (source, target), "wall": wall, "move": total, "planned": planned,
            "let_go": let_go, "deprovisioning": deprovisioning, "booted": booted, "join": wall - total,
            "ours": wall - deprovisioning}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--deprovision-seconds", type=float, default=5)
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args()
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        sys.exit("bench/move.py needs $KUBEBUILDER_ASSETS (make kube-assets) for the workload cluster's API")
    environ = env(args.deprovision_seconds)
    run(environ, "lab/lab.sh", "down")
    run(environ, "make", "-s", "dev-collection")
    t0 = time.monotonic()
    run(environ, "lab/lab.sh", "up")
    run(environ, "lab/lab.sh", "sim")
    run(environ, "lab/lab.sh", "converge")
    print("lab up and converged in %.1f s (1 GPU host, a Kubernetes worker; deprovisioning %.1f s)"
          % (time.monotonic() - t0, args.deprovision_seconds))
    slurm, kube = NAME + "-gpu", NAME + "-k8s-gpu"
    rows = []
    try:
        for dummy in range(args.rounds):
            rows.append(move(environ, kube, slurm))
            rows.append(move(environ, slurm, kube))
    finally:
        if not args.keep:
            run(environ, "lab/lab.sh", "down")
    head = ("direction", "wall", "planned", "let go", "deprov", "claim+boot", "join", "ours")
    print("%-34s %7s %8s %7s %7s %10s %6s %6s" % head)
    for r in rows:
        print("%-34s %7.1f %8.1f %7.1f %7.1f %10.1f %6.1f %6.1f" % (
            r["direction"], r["wall"], r["planned"], r["let_go"], r["deprovisioning"], r["booted"], r["join"],
            r["ours"]))
    for direction in (kube + " -> " + slurm, slurm + " -> " + kube):
        mine = [r for r in rows if r["direction"] == direction]
        print("median %s: wall %.1f s, the collection's part (wall less deprovisioning) %.1f s" % (
            direction, statistics.median(r["wall"] for r in mine), statistics.median(r["ours"] for r in mine)))


if __name__ == "__main__":
    main()
