"""Benchmark: accounting and the REST API in a lab of its own (prebaked image, 1 controller with
slurmdbd and MariaDB, 1 compute node; tests/e2e/labkit.py brings it up).

Prints:
  - site.yml: the first converge (accounting and REST included) and the second (nothing to change);
  - a job's end -> its final record in accounting (sbatch --wait, then sacct polled every 0.1 s);
  - slurmrestd: the median time of GET /slurm/v0.0.38/ping and /jobs with a token, beside
    `squeue` and `scontrol ping` on the controller;
  - accounting_backup.yml: its time and the dump's size.

    python3 bench/accounting.py [--jobs 10] [--calls 50] [--keep]
"""

import argparse
import os
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from labkit import Lab  # noqa: E402  pylint: disable=wrong-import-position

LAB = Lab("acbench", "10.89.92", 16492, ".lab/acbench", LAB_COMPUTE="1", LAB_DIRECTORY="0")
CTL = "acbench-ctl-01"

# on the controller: N timed calls, the median in ms (the token read from stdin)
TIMED = r"""
import statistics, subprocess, sys, time, urllib.request
what, n, token = sys.argv[1], int(sys.argv[2]), sys.stdin.read().strip()
out = []
for _ in range(n):
    t = time.perf_counter()
    if what.startswith("/"):
        urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:6820" + what, headers={
            "X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token})).read()
    else:
        subprocess.run(what, shell=True, check=True, capture_output=True)
    out.append((time.perf_counter() - t) * 1000)
print("%.1f %.1f" % (statistics.median(out), max(out)))
"""


def timed(cmd):
    t = time.time()
    res = cmd()
    return time.time() - t, res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=10, help="jobs timed from their end to their record")
    ap.add_argument("--calls", type=int, default=50, help="calls per REST endpoint and command")
    ap.add_argument("--keep", action="store_true", help="leave the lab up")
    args = ap.parse_args()
    LAB.up(converge=False)
    first, res = timed(lambda: LAB.playbook("site.yml"))
    assert res.returncode == 0, res.stdout[-3000:]
    second, res = timed(lambda: LAB.playbook("site.yml"))
    assert res.returncode == 0 and all("changed=0" in line for line in res.stdout.splitlines() if " : ok=" in line)
    print("site.yml with accounting and REST (1 controller + slurmdbd + MariaDB, 1 compute):")
    print("  first converge   %6.1f s" % first)
    print("  second converge  %6.1f s (0 changed)" % second)

    delays = []
    while len(delays) < args.jobs:
        job = LAB.on(CTL, "sbatch --parsable --wait --wrap true").stdout.strip()
        ended = time.time()
        while not LAB.on(CTL, "sacct -nPX -j %s -o State" % job).stdout.strip().startswith("COMPLETED"):
            time.sleep(0.1)
        delays.append(time.time() - ended)
    print("job end -> final record in accounting (%d jobs; includes one podman exec per poll, ~0.1-0.2 s):"
          % args.jobs)
    print("  median %.2f s, max %.2f s" % (statistics.median(delays), max(delays)))

    token = LAB.on(CTL, "scontrol token username=root lifespan=600").stdout.strip().split("=", 1)[1]
    print("on the controller, %d calls each: median / max ms" % args.calls)
    for what in ("/slurm/v0.0.38/ping", "/slurm/v0.0.38/jobs", "/slurmdb/v0.0.38/jobs", "squeue", "scontrol ping"):
        out = LAB.sh("podman", "exec", "-i", CTL, "python3", "-c", TIMED, what, str(args.calls),
                     input_text=token).stdout.split()
        print("  %-24s %7s / %s" % (what if what.startswith("/") else "CLI: " + what, out[0], out[1]))

    took, res = timed(lambda: LAB.playbook("accounting_backup.yml"))
    assert res.returncode == 0, res.stdout[-3000:]
    dump = re.search(r"accounting backup: (\S+)", res.stdout).group(1)
    size = LAB.on(CTL, "stat -c %s " + dump).stdout.strip()
    print("accounting_backup.yml: %.1f s, dump %s bytes (%s jobs in the database)"
          % (took, size, LAB.on(CTL, "sacct -nPX -a -S 2000-01-01 -o JobID | wc -l").stdout.strip()))
    if not args.keep:
        LAB.down()


if __name__ == "__main__":
    main()
