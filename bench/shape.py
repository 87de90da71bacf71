"""Benchmark: what a GPU node's GRES and a highmem node cost on the scale-up path (prebaked lab, on the real
Cluster API, CAPM3 and Bare Metal Operator).

From every new Machine Provisioned to every new node IDLE in Slurm (scale_up.yml, as AWX
would run it), for one new node of each kind, each measured --repeat times:
- compute, from its MachineDeployment: the baseline (the controllers are not touched);
- gpu, from its MachineDeployment: also writes the node's gres.conf line on the controller and
  runs `scontrol reconfigure` before it registers;
- highmem, from its MachineDeployment (a partition of its own).
(MachinePools are not measured: CAPM3 has no MachinePool machines.)
After each run the pool goes back to one node (scale_down.yml), so every run adds one node
to the same cluster. Also: the time of a GPU job on the new node (srun --gres=gpu:2).

    python3 bench/shape.py [--repeat 3]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, LAB_NAME="sbench", LAB_SUBNET_PREFIX="10.89.89", LAB_API_PORT="16489",
           LAB_STATE=".lab/sbench", LAB_FLAVOUR="prebaked", LAB_CONTROLLERS="1", LAB_COMPUTE="1", LAB_GPU="1",
           LAB_HIGHMEM="1", LAB_DIRECTORY="0",
           CONTAINERS_CONF=os.path.join(REPO, "lab", "containers.conf"),
           ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))


def sh(*cmd):
    proc = subprocess.run(list(cmd), cwd=REPO, env=ENV, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (" ".join(cmd), proc.stdout[-2000:], proc.stderr[-2000:]))
    return proc.stdout


def scale(node_type, replicas):
    out = sh("python3", "lab/scale.py", str(replicas), "--node-type", node_type)
    up = re.search(r"scale_up.yml done in ([\d.]+) s", out)
    return float(up.group(1)) if up else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("shape benchmark: lab 'sbench', 1 controller + 1 compute + 1 gpu + 1 highmem, prebaked",
          flush=True)
    sh("lab/lab.sh", "down")
    sh("make", "-s", "dev-collection")
    sh("lab/lab.sh", "up")
    sh("lab/lab.sh", "mgmt")
    sh("lab/lab.sh", "converge")
    try:
        for node_type, what in (("compute", "compute"), ("gpu", "gpu (gres.conf + reconfigure)"),
                                ("highmem", "highmem")):
            times = []
            for dummy in range(args.repeat):
                times.append(scale(node_type, 2))
                if node_type == "gpu":
                    node = sh("podman", "exec", "sbench-ctl-01", "sinfo", "-h", "-p", "gpu", "-N", "-o", "%N").split()[-1]
                    t0 = time.time()
                    out = subprocess.run(["podman", "exec", "sbench-ctl-01", "srun", "-p", "gpu", "-w", node,
                                          "--gres=gpu:2", "printenv", "CUDA_VISIBLE_DEVICES"],
                                         capture_output=True, text=True, check=False)
                    print("  srun --gres=gpu:2 on a GPU node: %.2f s (CUDA_VISIBLE_DEVICES=%s)"
                          % (time.time() - t0, out.stdout.strip()), flush=True)
                scale(node_type, 1)
            print("+1 %-50s Provisioned -> IDLE: median %5.1f s, min %5.1f s, max %5.1f s (%d runs)"
                  % (what, statistics.median(times), min(times), max(times), len(times)), flush=True)
    finally:
        sh("lab/lab.sh", "down")


if __name__ == "__main__":
    main()
