"""Benchmark: the fleet - how each operation's cost grows with the number of compute machines.

For each size N (default 1, 4, 16, 48 compute machines beside one controller, in a lab of its own,
prebaked image, no directory machine), from a fresh lab:

  first converge        site.yml on the new machines
  validate              validate.yml (a job on every node)
  second converge       site.yml again: the fast path (nothing changed); beside it an empty play
                        (one ping per host through the same inventory), the floor it is compared with
  reconcile, nothing    reconcile.yml when Cluster API and Slurm agree: the hosts it touched are counted
  reconcile, 25 % dead  reconcile.yml after slurmd was killed (SIGKILL) on a quarter of the nodes and
                        Slurm marked them not responding: every node IDLE again
  scale-up (events)     +N/4 Machines through the event path (ansible-rulebook, reconcile.yml): from the
                        scale command, and from Provisioned, to every new node IDLE
  scale-up (boot)       +N/4 Machines that join Slurm at their first boot (join_at_boot.yml): the same
  scale-down            -N/2 Machines at once, a job running on half of the leaving nodes: scale command ->
                        Machines gone (scale_down.yml), and its part after the last job ended; every job
                        COMPLETED with exit code 0:0, or the benchmark fails

Each is printed as time and time per host, then fitted over the sizes (t = a + b*N, and whether a
quadratic term matters): constant, linear or worse.

    python3 bench/fleet.py [--sizes 1,4,16,48] [--job-seconds 30] [--baseline REF]

--baseline REF also runs reconcile.yml with nothing to do from the collection as it was at the git
commit REF (extracted into .lab/fleet-baseline), on the same lab right after the current one: a
before/after of a change in the same run.

The lab is named fbench (10.89.95.0/24, API port 16495, state .lab/fleet) and is removed at the end.
"""

import argparse
import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from labkit import Lab, wait_for  # noqa: E402  pylint: disable=wrong-import-position

from kubernetes import client, config  # noqa: E402  pylint: disable=wrong-import-position

NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
CLUSTER = "fbench"
EMPTY_PLAY = ("- name: An empty play\n  hosts: all\n  gather_facts: false\n  tasks:\n"
              "    - name: Reach the host\n      ansible.builtin.ping:\n")


class Fleet:
    def __init__(self, size, baseline=None):
        self.size = size
        self.baseline = baseline
        self.lab = Lab(CLUSTER, "10.89.95", 16495, ".lab/fleet", LAB_COMPUTE=str(size), LAB_DIRECTORY="0")
        self.rows = {}

    # ------------------------------------------------------------------ helpers
    def timed(self, what, playbook, *extra, expect=None):
        t0 = time.time()
        res = self.lab.playbook(playbook, *extra)
        took = time.time() - t0
        if res.returncode != 0:
            sys.exit("%s (N=%d) failed:\n%s" % (what, self.size, res.stdout[-4000:]))
        if expect and expect not in res.stdout:
            sys.exit("%s (N=%d): %r not in its output:\n%s" % (what, self.size, expect, res.stdout[-4000:]))
        return took, res.stdout

    def record(self, key, seconds, hosts, note=""):
        self.rows[key] = (seconds, hosts)
        suffix = "  " + note if note else ""
        print("  %-22s %8.1f s  %6.2f s/host over %3d host(s)%s"
              % (key, seconds, seconds / max(hosts, 1), hosts, suffix), flush=True)

    @contextlib.contextmanager
    def ssh_counted(self):
        """Count the SSH sessions Ansible opens to each host meanwhile (its ssh_executable, a wrapper that
        notes the address and runs ssh); yields a function that summarises them: 'total (per host)'."""
        log = os.path.join(self.lab.state, "ssh-sessions.log")
        wrapper = os.path.join(self.lab.state, "ssh-counted")
        with open(wrapper, "w") as fh:
            fh.write('#!/bin/sh\nfor a in "$@"; do case "$a" in 10.89.95.*) echo "$a" >>%s;; esac; done\n'
                     'exec ssh "$@"\n' % log)
        os.chmod(wrapper, 0o755)
        if os.path.exists(log):
            os.remove(log)
        self.lab.env["ANSIBLE_SSH_EXECUTABLE"] = wrapper

        def summary():
            try:
                with open(log) as fh:
                    seen = [line.strip() for line in fh if line.strip()]
            except FileNotFoundError:
                seen = []
            per = {}
            for addr in seen:
                per[addr] = per.get(addr, 0) + 1
            return "%d to %d host(s)%s" % (len(seen), len(per), " (%s)" % ", ".join(
                "%s: %d" % (a, c) for a, c in sorted(per.items())) if len(per) <= 3 else "")
        try:
            yield summary
        finally:
            del self.lab.env["ANSIBLE_SSH_EXECUTABLE"]

    def ctl(self, command, check=True):
        return self.lab.on(CLUSTER + "-ctl-01", command, check=check).stdout

    def nodes(self):
        """Slurm's nodes and their short state (idle, idle*, alloc...), asked on the controller."""
        out = self.ctl("sinfo --noheader --Node --format '%N %t'")
        return dict(line.split() for line in out.splitlines() if line.strip())

    def api(self):
        return client.CustomObjectsApi(config.new_client_from_config(
            os.path.join(self.lab.state, "capi", "kubeconfig")))

    def machines(self):
        """The compute MachineDeployment's live Machines by their host name."""
        items = self.api().list_namespaced_custom_object(
            G, V, NS, "machines", label_selector="cluster.x-k8s.io/deployment-name=%s-compute" % CLUSTER)["items"]
        out = {}
        for machine in items:
            if machine["metadata"].get("deletionTimestamp"):
                continue
            host = next((a["address"] for a in (machine.get("status") or {}).get("addresses") or []
                         if a["type"] == "Hostname"), machine["metadata"]["name"])
            out[host] = machine["metadata"]["name"]
        return out

    def scale(self, replicas, *flags):
        t0 = time.time()
        out = self.lab.sh("python3", "lab/scale.py", str(replicas), *flags, timeout=1800).stdout
        return time.time() - t0, out

    def all_idle(self, names):
        state = self.nodes()
        return all(state.get(n) == "idle" for n in names)

    # ------------------------------------------------------------------ the operations
    def run(self, job_seconds):
        n = self.size
        quarter, half = max(1, n // 4), max(1, n // 2)
        hosts = n + 1
        print("== 1 controller + %d compute" % n, flush=True)
        t0 = time.time()
        self.lab.up(converge=False)
        print("  machines booted and the management cluster up in %.1f s" % (time.time() - t0), flush=True)

        took = self.timed("first converge", "site.yml")[0]
        self.record("first converge", took, hosts)
        took = self.timed("validate", "validate.yml")[0]
        self.record("validate", took, hosts)
        with self.ssh_counted() as reached:
            took, out = self.timed("second converge", "site.yml", expect="nothing to do")
        changed = sum(int(c) for c in re.findall(r"changed=(\d+)", out[out.rindex("PLAY RECAP"):]))
        self.record("second converge", took, hosts, "changed=%d; SSH sessions: %s" % (changed, reached()))
        empty = os.path.join(self.lab.state, "empty.yml")
        with open(empty, "w") as fh:
            fh.write(EMPTY_PLAY)
        t1 = time.time()
        self.lab.sh("ansible-playbook", "-i", os.path.join(self.lab.state, "capi.capi_machines.yml"), empty)
        self.record("empty play", time.time() - t1, hosts)

        # the same two, with what a fleet could change in Ansible's settings (environment, not variables: the
        # fast path's digest stays): the Python named (no interpreter discovery, one SSH session per host
        # less) and 50 forks instead of ansible.cfg's 20
        for label, setting in (("python named", {"ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3"}),
                               ("50 forks", {"ANSIBLE_FORKS": "50"})):
            self.lab.env.update(setting)
            try:
                with self.ssh_counted() as reached:
                    took, out = self.timed("second converge, " + label, "site.yml", expect="nothing to do")
                self.record("second, " + label, took, hosts, "SSH sessions: %s" % reached())
                t1 = time.time()
                self.lab.sh("ansible-playbook", "-i", os.path.join(self.lab.state, "capi.capi_machines.yml"), empty)
                self.record("empty, " + label, time.time() - t1, hosts)
            finally:
                for key in setting:
                    del self.lab.env[key]

        with self.ssh_counted() as reached:
            took, out = self.timed("reconcile (nothing to do)", "reconcile.yml", expect="reconcile: nothing to do")
        self.record("reconcile, nothing", took, hosts, "SSH sessions: %s" % reached())
        if self.baseline:
            took = self.baseline_reconcile()
            self.record("reconcile, nothing (%s)" % self.baseline[0], took, hosts, "before the change")

        victims = sorted(self.machines())[:quarter]
        for name in victims:
            self.lab.on(name, "systemctl kill --signal=KILL slurmd.service")
        wait_for("Slurm to mark %s not responding" % ", ".join(victims),
                 lambda: all(self.nodes().get(v, "").endswith("*") for v in victims), 240, poll=2)
        took = self.timed("reconcile (25 % dead)", "reconcile.yml")[0]
        wait_for("every node IDLE after the reconcile", lambda: self.all_idle(self.machines()), 60)
        self.record("reconcile, 25% dead", took, len(victims), "slurmd killed on %d" % len(victims))

        # scale-up through the event path
        self.lab.sh("lab/lab.sh", "events")
        try:
            time.sleep(5)
            wait_for("the event path's first reconcile", lambda: "PLAY RECAP" in self.events_log(), 300, poll=2)
            wait_for("no reconcile running", lambda: self.lab.sh("pgrep", "-f", "playbooks/reconcile.yml",
                                                                 check=False).returncode != 0, 300, poll=2)
            took, out = self.scale(n + quarter)
            found = re.search(r"IDLE ([\d.]+) s after Provisioned, ([\d.]+) s after the scale", out)
            self.record("scale-up +%d (events)" % quarter, float(found.group(2)), quarter,
                        "Provisioned -> IDLE %s s" % found.group(1))
        finally:
            self.lab.sh("lab/lab.sh", "events-stop")

        # scale-up through join at boot
        self.lab.playbook("join_at_boot.yml", '{"converged_join_at_boot": ["%s-compute"]}' % CLUSTER)
        self.api().patch_namespaced_custom_object(
            G, V, NS, "machinedeployments", CLUSTER + "-compute",
            {"spec": {"template": {"spec": {"bootstrap": {"dataSecretName": CLUSTER + "-compute-join"}}}}})
        took, out = self.scale(n + 2 * quarter, "--wait-idle")
        found = re.search(r"IDLE (-?[\d.]+) s after Provisioned, ([\d.]+) s after the scale", out)
        self.record("scale-up +%d (boot)" % quarter, float(found.group(2)), quarter,
                    "Provisioned -> IDLE %s s" % found.group(1))

        # scale-down -N/2 at once, a job on half of the leaving nodes
        live = self.machines()
        leaving = sorted(live)[-half:]
        busy = leaving[:math.ceil(half / 2)]
        jobs = []
        for node in busy:
            jobs.append(self.ctl("sbatch --parsable --nodelist=%s --output=/dev/null --wrap 'sleep %d'"
                                 % (node, job_seconds)).strip())
        for job in jobs:
            wait_for("job %s to run" % job, lambda j=job: self.lab.job_state(CLUSTER + "-ctl-01", j) == "RUNNING",
                     120, poll=1)
        for node in leaving:
            self.api().patch_namespaced_custom_object(
                G, V, NS, "machines", live[node],
                {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}})
        took, out = self.scale(len(live) - half)
        gone_at = time.time()
        ends = []
        for job in jobs:
            rec = self.ctl("scontrol show job %s" % job)
            state, code = re.search(r"JobState=(\S+)", rec).group(1), re.search(r"ExitCode=(\S+)", rec).group(1)
            if (state, code) != ("COMPLETED", "0:0"):
                sys.exit("scale-down (N=%d): job %s ended %s %s" % (self.size, job, state, code))
            ends.append(self.ctl("date -d %s +%%s.%%N" % re.search(r"EndTime=(\S+)", rec).group(1)).strip())
        left = set(self.machines())
        if left & set(leaving) or len(left) != len(live) - half:
            sys.exit("scale-down (N=%d): the Machines left are %s" % (self.size, sorted(left)))
        after = gone_at - max(float(e) for e in ends)
        self.record("scale-down -%d" % half, took, half,
                    "%d job(s) COMPLETED 0:0; %.1f s after the last job ended" % (len(jobs), after))
        return self.rows

    def baseline_reconcile(self):
        """reconcile.yml with nothing to do, from the baseline commit's collection (its plugins too)."""
        ref, tree = self.baseline
        t0 = time.time()
        res = self.lab.sh("env", "ANSIBLE_COLLECTIONS_PATH=" + tree, "ansible-playbook", "-i",
                          os.path.join(self.lab.state, "capi.capi_machines.yml"),
                          os.path.join(tree, "ansible_collections", "converged", "hpc", "playbooks", "reconcile.yml"),
                          check=False)
        took = time.time() - t0
        if res.returncode != 0 or "reconcile: nothing to do" not in res.stdout:
            sys.exit("reconcile from %s (N=%d) failed:\n%s" % (ref, self.size, res.stdout[-4000:]))
        return took

    def events_log(self):
        try:
            with open(os.path.join(self.lab.state, "logs", "events.log"), errors="replace") as log:
                return log.read()
        except FileNotFoundError:
            return ""


def fit(points):
    """Least squares t = a + b*n over (n, t); with 3 points or more, also whether t = a + b*n + c*n^2
    explains them better by much: 'constant', 'linear' or 'worse than linear'."""
    count = len(points)
    mean_n = sum(p[0] for p in points) / count
    mean_t = sum(p[1] for p in points) / count
    var = sum((p[0] - mean_n) ** 2 for p in points)
    slope = sum((p[0] - mean_n) * (p[1] - mean_t) for p in points) / var if var else 0.0
    intercept = mean_t - slope * mean_n
    biggest = max(p[0] for p in points)
    if slope * biggest < 0.25 * max(intercept, 1e-9):
        kind = "constant"
    else:
        kind = "linear"
        # residuals of the line: a curve that bends up shows as the ends above it and the middle below
        resid = [p[1] - (intercept + slope * p[0]) for p in sorted(points)]
        if count >= 3 and resid[-1] > 0.15 * max(p[1] for p in points) and min(resid[1:-1]) < 0:
            kind = "worse than linear"
    return intercept, slope, kind


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,4,16,48")
    ap.add_argument("--job-seconds", type=int, default=30, help="how long the scale-down's jobs run")
    ap.add_argument("--baseline", metavar="REF", help="a git commit whose reconcile.yml is measured too")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    baseline = None
    if args.baseline:
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        tree = os.path.join(repo, ".lab", "fleet-baseline")
        dest = os.path.join(tree, "ansible_collections", "converged", "hpc")
        shutil.rmtree(tree, ignore_errors=True)
        os.makedirs(dest)
        archive = subprocess.run(["git", "-C", repo, "archive", args.baseline], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
        baseline = (args.baseline, tree)
    table = {}
    for size in sizes:
        fleet = Fleet(size, baseline)
        try:
            table[size] = fleet.run(args.job_seconds)
        finally:
            fleet.lab.down()
    keys = list(table[sizes[0]])
    print("\n%-22s" % "operation" + "".join("%14s" % ("N=%d" % s) for s in sizes) + "   growth (t = a + b*N)")
    for key in keys:
        base = re.sub(r" [+-]\d+", "", key)
        cells = "".join("%14s" % ("%.1f s" % table[s][k][0] if k else "-") for s, k in
                        ((s, next((k for k in table[s] if re.sub(r" [+-]\d+", "", k) == base), None)) for s in sizes))
        points = [(s, table[s][k][0]) for s in sizes
                  for k in table[s] if re.sub(r" [+-]\d+", "", k) == base]
        line = ""
        if len(points) >= 2:
            intercept, slope, kind = fit(points)
            line = "   %s: a=%.1f s, b=%.2f s/host; 1,000 nodes (projected) %.0f s" % (
                kind, intercept, slope, intercept + slope * 1000)
        print("%-22s%s%s" % (base, cells, line))


if __name__ == "__main__":
    main()
