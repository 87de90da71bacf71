"""Benchmark: Slurm 24.11 -> 26.05 in Slurm's order, with jobs running, on the lab of make e2e-upgrade (two
controllers in HA, two compute Machines joining at boot, a login node, the accounting database on a host of its
own; the real Cluster API, CAPM3 and Bare Metal Operator).

It runs that e2e (tests/e2e/test_upgrade.py: its four steps, each asserting nothing is lost) and prints what
the run measured, step by step: how long slurmdbd was away and the messages slurmctld kept for it meanwhile;
the control outage of the controllers' handover as upgrade_controllers.yml reports it, and the longest a
client's squeue on a compute node (asked again 0.25 s after each answer) waited between two answers in it and
while the reinstalled primary took control back; the compute rollout's wall time. Nothing is printed that the run did not measure; a failed step ends the run
with pytest's report.

    python3 bench/upgrade.py [--keep]
"""

import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(REPO, ".lab", "e2e-upgrade", "logs", "upgrade-figures.tsv")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--keep", action="store_true", help="leave the lab up (KEEP_LAB=1)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.keep:
        env["KEEP_LAB"] = "1"
    if os.path.exists(FIGURES):
        os.remove(FIGURES)
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/e2e/test_upgrade.py"],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    took = time.time() - t0
    summary = [line for line in proc.stdout.splitlines() if line.strip()][-1:] or ["(no pytest output)"]
    print("make e2e-upgrade's test: %s (%.0f s with the lab's bring-up)" % (summary[0], took))
    if os.path.exists(FIGURES):
        with open(FIGURES) as fh:
            for line in fh:
                what, _tab, value = line.rstrip("\n").partition("\t")
                print("  %-100s %s" % (what, value))
    if proc.returncode != 0:
        print(proc.stdout[-6000:])
        sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
