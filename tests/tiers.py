"""The two test tiers: `make test` (the gate, what CI runs) and `make test-all` (everything).

    python3 tests/tiers.py gate|all [--only SUITE[,SUITE...]] [--list]

A tier is a few streams run at once; a stream is suites run one after another; a suite is one command
(a make target), its output in .lab/logs/suite-<name>.log. How many streams a tier runs at once is set from
what the labs burn (docs/testing.md: two labs at once keep a 2-core machine busy; a third starves them).
While the tier runs, the machine's CPU is sampled every 5 s (/proc/stat) into .lab/logs/cpu-<tier>.tsv, so
each suite's line says how busy the machine was while it ran. At the end: one line per suite (passed or
FAILED, minutes, the machine's mean CPU), the commit, what failed (each failed suite's own error lines) and
the tier's verdict; the same summary is kept in .lab/logs/summary-<tier>.txt. Exits 1 when any suite failed.
"""

import argparse
import os
import re
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOGS = os.path.join(REPO, ".lab", "logs")
MAKE = ["make", "-s", "--no-print-directory"]

# every suite: its command and what it covers (the README's Tests section and docs/testing.md say the same)
SUITES = {
    "unit": (MAKE + ["unit"], "pytest tests/unit, tests/integration, tests/kube (the real kube-apiserver and controllers)"),
    "keda": (MAKE + ["kube-keda"], "KEDA v2.21 built from its module (make kube-assets KEDA=1) with the HPA controller: "
             "a compute MachineDeployment of the real Cluster API scaled 0 -> 3 -> 0 by a partition's demand from "
             "slurmrestd's jobs, held and dependent jobs scaling nothing"),
    "e2e-keda": (MAKE + ["e2e-keda"], "KEDA as the autoscaler in a lab (LAB_KEDA=1): keda.yml's token and ScaledObject, "
                 "held jobs scaling nothing, three jobs 0 -> 3 -> 0 on the lab's slurmrestd, every job COMPLETED"),
    "lint": (MAKE + ["lint"], "ansible-lint --profile production and ansible-test sanity"),
    "oldest-core": (["tests/matrix.sh", "2.16"],
                    "the oldest ansible-core claimed (2.16): unit tests, sanity's release tests, every playbook's syntax"),
    "newest-core": (["env", "MATRIX_STEPS=syntax", "tests/matrix.sh", "2.21"],
                    "the newest ansible-core (2.21, on Python 3.12+): every playbook's syntax (its facts and TLS tests "
                    "run in unit)"),
    "matrix": (["env", "MATRIX_UNIT=all", "tests/matrix.sh"],
               "every ansible-core claimed besides the test bed's 2.19 (2.16, 2.17, 2.18, 2.20, 2.21): unit tests, "
               "sanity's release tests, every playbook's syntax"),
    "elastic-gate": (MAKE + ["e2e-elastic", "E2E_MARK=gate"],
                     "the elastic lab (HA, accounting host), its gate tests: a leaving node powered off (scale_up.yml "
                     "and scale_down.yml), the event path, the primary killed mid-drain, 0 lost in sacct"),
    "autoscale-gate": (MAKE + ["e2e-autoscale", "E2E_MARK=gate"],
                       "the autoscale lab, its gate tests: 0 -> max -> 0 by the rulebook's tick, held jobs scale nothing"),
    "converged-gate": (MAKE + ["e2e-converged", "E2E_MARK=gate"],
                       "the shared pool, its gate tests: moves both ways with a job waiting, a GPU host joining at boot"),
    "storage-gate": (MAKE + ["e2e-storage", "E2E_MARK=gate"],
                     "the storage and identity lab, its gate tests: NFS, SSSD users, an MPI job as alice, REST, sacct"),
    "rollout-gate": (MAKE + ["e2e-rollout", "E2E_MARK=gate"],
                     "the rollout lab, its gate tests: wrong rollouts refused, a busy 4-node cluster rolled to a new "
                     "image with every job COMPLETED 0:0"),
    "upgrade-gate": (MAKE + ["e2e-upgrade", "E2E_MARK=gate"],
                     "the upgrade lab (Debian forky's images built first), its gate test: slurmdbd 24.11 -> 26.05 "
                     "with a checked dump, the database converted, the messages kept meanwhile, every job in sacct"),
    "elastic": (MAKE + ["e2e-elastic"], "the elastic lab whole, with its 3-minute soak"),
    "autoscale": (MAKE + ["e2e-autoscale"], "the autoscale lab whole"),
    "converged": (MAKE + ["e2e-converged"], "the shared pool lab whole"),
    "storage": (MAKE + ["e2e-storage"], "the storage and identity lab whole"),
    "shape": (MAKE + ["e2e-shape"], "the shape lab whole (login, GPU, highmem, hardware, join at boot)"),
    "two": (MAKE + ["e2e-two"], "two clusters on one management cluster"),
    "rollout": (MAKE + ["e2e-rollout"], "a new node image rolled over a busy cluster, a broken one stopped and rolled "
                "back, a deadline kept (playbooks/rollout.yml)"),
    "images-bookworm": (MAKE + ["images-bookworm"], "the Debian 12 images (for the Slurm 22.05 lab and scenario)"),
    "forky": (MAKE + ["e2e-forky"], "Debian forky machines (its images built first): Slurm 26.05 on Python 3.14 "
              "hosts by ansible-core 2.21, the main job, a second converge changing nothing"),
    "upgrade": (MAKE + ["e2e-upgrade"], "Slurm 24.11 -> 26.05 in Slurm's order on an HA cluster with jobs running: "
                "slurmdbd reinstalled with forky (the database converted), the controllers handed over "
                "(upgrade_controllers.yml), the compute nodes rolled to forky's image (rollout.yml), the login "
                "node; validate.yml on 26.05 (MPI, REST), every job in sacct"),
    "releases": (MAKE + ["e2e-releases"], "Slurm 22.05 on the oldest ansible-core, an unsafe upgrade refused"),
    "cores-lab": (MAKE + ["e2e-cores"],
                  "the main job on ansible-core 2.21 (Python 3.13) and 2.16: converge, validate with accounting and "
                  "REST, a whole converge again changing nothing"),
    "molecule-default": (MAKE + ["molecule", "SCENARIOS=default"], "molecule: the lab image boots"),
    "molecule-cluster": (MAKE + ["molecule", "SCENARIOS=cluster"], "molecule: the cluster scenario"),
    "molecule-ha": (MAKE + ["molecule", "SCENARIOS=ha"], "molecule: the ha scenario (takeover timings)"),
    "molecule-22.05": (MAKE + ["molecule-22.05"], "molecule: the cluster scenario on Debian 12 (Slurm 22.05)"),
}

# the streams of each tier, run at once (two: see the module's docstring)
TIERS = {
    "gate": [
        ["elastic-gate", "storage-gate", "converged-gate", "rollout-gate", "lint", "newest-core", "oldest-core"],
        ["unit", "autoscale-gate", "upgrade-gate"],
    ],
    "all": [
        ["elastic", "two", "images-bookworm", "releases", "molecule-22.05", "molecule-default", "matrix", "cores-lab",
         "forky", "upgrade"],
        ["unit", "autoscale", "converged", "shape", "storage", "rollout", "molecule-cluster", "molecule-ha", "keda",
         "e2e-keda", "lint"],
    ],
}

# the lines of a suite's log that say what failed: pytest's, ansible-test's, ansible-lint's, molecule's, the matrix's
FAILED_LINE = re.compile(r"^(FAILED|ERROR) |^(ERROR|FATAL): |Failed.{0,8}: [0-9]+ failure|CRITICAL|"
                         r"Molecule executed .*failed|^\[matrix\] failed|^make: \*\*\*")


class Sampler(threading.Thread):
    """The machine's CPU busy share (of all cores) and load average every 5 s, written to path."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path, self.samples, self.stop = path, [], threading.Event()

    @staticmethod
    def _times():
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle

    def run(self):
        with open(self.path, "w") as out:
            out.write("time\tbusy_percent\tload1\n")
            total, idle = self._times()
            while not self.stop.wait(5):
                now_total, now_idle = self._times()
                busy = 100.0 * (1 - (now_idle - idle) / max(1, now_total - total))
                total, idle = now_total, now_idle
                with open("/proc/loadavg") as fh:
                    load = float(fh.read().split()[0])
                self.samples.append((time.time(), busy, load))
                out.write("%.0f\t%.1f\t%.2f\n" % (time.time(), busy, load))
                out.flush()

    def mean(self, start, end):
        picked = [(busy, load) for when, busy, load in self.samples if start <= when <= end]
        if not picked:
            return None
        return sum(busy for busy, _load in picked) / len(picked), max(load for _busy, load in picked)


SAY = threading.Lock()


def say(text):
    """One line of the tier's progress (the streams print from threads of their own: a line each, whole)."""
    with SAY:
        print(text, flush=True)


def run_stream(names, results, tier):
    for name in names:
        cmd = SUITES[name][0]
        log = os.path.join(LOGS, "suite-%s.log" % name)
        start = time.time()
        say("[%s] %s: started (%s, log %s)" % (tier, name, " ".join(cmd), os.path.relpath(log, REPO)))
        with open(log, "w") as out:
            rc = subprocess.call(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        end = time.time()
        results[name] = (rc, start, end)
        verdict = "passed" if rc == 0 else "FAILED (exit %d)" % rc
        say("[%s] %s: %s after %.1f min" % (tier, name, verdict, (end - start) / 60))


def closing_line(name):
    """The suite's own closing line (pytest's "N passed ...", molecule's, the matrix's), if it printed one."""
    try:
        with open(os.path.join(LOGS, "suite-%s.log" % name), errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    found = [line.strip("= ") for line in lines
             if re.search(r"\d+ (passed|failed)|^\[matrix\] (every|failed)|Passed: \d+|Molecule executed", line)]
    return "; ".join(found[-3:])[:200]


def pytest_counts(names):
    """The pytest tests the suites ran, from each one's closing lines: (passed, failed and errors)."""
    passed = failed = 0
    for name in names:
        try:
            with open(os.path.join(LOGS, "suite-%s.log" % name), errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        for line in text.splitlines():
            if re.search(r"^=*\s*\d+ (passed|failed|error)", line.strip()) and re.search(r" in [\d.]+s", line):
                passed += sum(int(n) for n in re.findall(r"(\d+) passed", line))
                failed += sum(int(n) for n in re.findall(r"(\d+) (?:failed|errors?)\b", line))
    return passed, failed


def failed_lines(name):
    try:
        with open(os.path.join(LOGS, "suite-%s.log" % name), errors="replace") as fh:
            lines = [line.rstrip() for line in fh if FAILED_LINE.search(line)]
    except OSError:
        return ["(no log)"]
    return [line[:300] for line in lines[-15:]] or ["(no error line: the end of its log)"] + tail(name)


def tail(name, count=15):
    with open(os.path.join(LOGS, "suite-%s.log" % name), errors="replace") as fh:
        return [line.rstrip()[:300] for line in fh.readlines()[-count:]]


def commit():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True, check=False).stdout.strip()
    return head + (" (with uncommitted changes)" if dirty else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tier", choices=sorted(TIERS))
    parser.add_argument("--only", help="run only these suites of the tier (comma-separated), in its streams")
    parser.add_argument("--list", action="store_true", help="list the tier's streams and suites, run nothing")
    args = parser.parse_args()
    streams = TIERS[args.tier]
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {n for s in streams for n in s})
        if unknown:
            parser.error("not a suite of the %s tier: %s (--list names them)" % (args.tier, ", ".join(unknown)))
        streams = [[n for n in s if n in wanted] for s in streams]
        streams = [s for s in streams if s]
    if args.list:
        for i, stream in enumerate(streams, 1):
            for name in stream:
                print("stream %d  %-16s %s" % (i, name, SUITES[name][1]))
        return 0
    os.makedirs(LOGS, exist_ok=True)
    sampler = Sampler(os.path.join(LOGS, "cpu-%s.tsv" % args.tier))
    sampler.start()
    started, results = time.time(), {}
    threads = [threading.Thread(target=run_stream, args=(s, results, args.tier)) for s in streams]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ended = time.time()
    sampler.stop.set()
    summary = ["[%s] commit %s, %s, %d streams at once on %d cores" % (
        args.tier, commit(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), len(streams), os.cpu_count())]
    summary.append("[%s] %-16s %-8s %7s %9s %6s  %s" % (
        args.tier, "suite", "result", "minutes", "CPU busy", "load", "its closing line"))
    for stream in streams:
        for name in stream:
            rc, start, end = results.get(name, (None, started, started))
            cpu = sampler.mean(start, end)
            summary.append("[%s] %-16s %-8s %7.1f %8s%% %6s  %s" % (
                args.tier, name, "passed" if rc == 0 else "FAILED", (end - start) / 60,
                "%.0f" % cpu[0] if cpu else "-", "%.1f" % cpu[1] if cpu else "-", closing_line(name)))
    failed = [n for n, result in results.items() if result[0] != 0]
    whole = sampler.mean(started, ended)
    summary.append("[%s] the machine's CPU over the tier: %s%% busy on average, load at most %s (%s)" % (
        args.tier, "%.0f" % whole[0] if whole else "-", "%.1f" % whole[1] if whole else "-",
        os.path.relpath(sampler.path, REPO)))
    for name in failed:
        summary.append("[%s] what failed in %s (.lab/logs/suite-%s.log):" % (args.tier, name, name))
        summary.extend("    " + line for line in failed_lines(name))
    summary.append("[%s] %s: %d of %d suites passed in %.1f min" % (
        args.tier, "FAILED" if failed else "passed", len(results) - len(failed), len(results), (ended - started) / 60))
    passed, failed_tests = pytest_counts(n for stream in streams for n in stream)
    summary.append("tests: %d passed, %d failed" % (passed, failed_tests))
    text = "\n".join(summary)
    print(text, flush=True)
    with open(os.path.join(LOGS, "summary-%s.txt" % args.tier), "w") as fh:
        fh.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
