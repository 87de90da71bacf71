"""The soak: random faults over a set time while jobs run, then proof that nothing was lost (docs/soak.md).

    python3 tests/soak.py [--seed N] [--minutes 10] [--replicas 1-4] [--hold-limit 300] [--schedule]

It runs on the lab lab/lab.sh runs with the same LAB_* settings (LAB_NAME, LAB_STATE, LAB_API_PORT...): two
controllers in HA (LAB_HA=1), Slurm accounting (slurmdbd: the final word on each job), the real management
cluster; it starts the event path (lab/lab.sh events) if it is not running, and stops it at the end if it
started it. A seeded random schedule (printed first, and again on failure; --schedule prints it and stops) of:

- scale: the compute MachineDeployment's replicas set (Cluster API picks which Machines go);
- burst: two replica changes within the same second;
- slurmd: a compute node's slurmd killed (SIGKILL);
- power: a compute machine powered off (podman kill), on again some seconds later if it still exists;
- primary: the primary controller's machine killed, started again later;
- api: the management cluster's kube-apiserver stopped (SIGSTOP) some seconds, then continued;
- events: the event path stopped (with the reconcile it may be running), started again some seconds later;
- duplicate: reconcile.yml started by hand beside the event path's, as a webhook delivered twice or late would.

Meanwhile a stream of jobs is submitted (short, long, two-node, arrays; --requeue, as a site's batch jobs are).
Checked all along: no compute Machine stays held by our hook more than --hold-limit seconds after its node left
Slurm (or while it never joined). At the end, every fault undone: every job submitted has its final record in
accounting, COMPLETED 0:0 (requeued ones counted and named); then one reconcile.yml leaves Slurm and Cluster API
agreeing (each live compute Machine an idle node, nothing else) and the next has nothing to do.

The figures go to <LAB_STATE>/logs/soak.json; the exit code is 0 when every check held. Same seed, same schedule:
a run replays as closely as the machine's timing allows.
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
# what a fault is, how often it comes (weights), how long the outages last (s)
KINDS = {"scale": 6, "burst": 2, "slurmd": 2, "power": 2, "primary": 1, "api": 1, "events": 1, "duplicate": 2}
# A machine powered off stays off longer than the lab's SlurmdTimeout (30 s), as a real one does (its power cycle
# and boot take minutes, and Slurm sees its boot time change); a lab machine back sooner keeps the host's boot time,
# so Slurm never learns that its processes died, and a job whose task died there waits for its time limit.
OUTAGE = {"power": (40, 75), "primary": (30, 75), "api": (8, 25), "events": (0, 10)}
JOBS = {"short": 5, "long": 2, "two-node": 2, "array": 1}
# a job accepted this long before the primary's machine was killed may be missing from the state the backup loads
WINDOW_SECONDS = 3
UNFINISHED = {"RUNNING", "PENDING", "REQUEUED", "COMPLETING", "CONFIGURING", "SUSPENDED", "RESIZING"}


def make_schedule(seed, seconds, replicas, gap=(12, 40), without=()):
    """The faults of a run: a list of steps {at, kind, ...}, the same for the same arguments (without: kinds left
    out)."""
    rng = random.Random(seed)
    kinds = sorted(k for k in KINDS if k not in without)
    steps, at = [], rng.uniform(5, 15)
    while at < seconds:
        kind = rng.choices(kinds, [KINDS[k] for k in kinds])[0]
        step = {"at": round(at, 1), "kind": kind}
        if kind == "scale":
            step["replicas"] = rng.randint(*replicas)
        elif kind == "burst":
            step["replicas"] = [rng.randint(*replicas), rng.randint(*replicas)]
        if kind in ("slurmd", "power"):
            step["pick"] = round(rng.random(), 3)  # which node: a fraction of the sorted list then
        if kind in OUTAGE:
            step["for"] = round(rng.uniform(*OUTAGE[kind]), 1)
        steps.append(step)
        at += rng.uniform(*gap)
    return steps


def make_jobs(seed, seconds, gap=(6, 16)):
    """The jobs of a run: (at, kind, sbatch arguments), seeded apart from the faults."""
    rng = random.Random(seed * 7919 + 1)
    kinds = sorted(JOBS)
    jobs, at = [], rng.uniform(1, 4)
    while at < seconds:
        kind = rng.choices(kinds, [JOBS[k] for k in kinds])[0]
        if kind == "short":
            args = "--nodes=1 --wrap 'sleep %d'" % rng.randint(1, 10)
        elif kind == "long":
            args = "--nodes=1 --wrap 'sleep %d'" % rng.randint(30, 90)
        elif kind == "two-node":
            args = "--nodes=2 --wrap 'srun sleep %d'" % rng.randint(5, 30)
        else:
            args = "--nodes=1 --array=0-%d --wrap 'sleep %d'" % (rng.randint(1, 4), rng.randint(2, 10))
        jobs.append((round(at, 1), kind, args))
        at += rng.uniform(*gap)
    return jobs


class Lab:
    """The running lab, as lab/lab.sh's settings name it."""

    def __init__(self, env=None):
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("CONTAINERS_CONF", os.path.join(REPO, "lab", "containers.conf"))
        self.env.setdefault("ANSIBLE_CONFIG", os.path.join(REPO, "ansible.cfg"))
        self.name = self.env.get("LAB_NAME", "clab")
        self.state = os.path.join(REPO, self.env.get("LAB_STATE", ".lab"))
        self.api_port = int(self.env.get("LAB_API_PORT", "16443"))
        self.md = self.name + "-compute"
        from kubernetes import client, config  # the lab's own requirement (requirements.txt)
        api = config.new_client_from_config(os.path.join(self.state, "capi", "kubeconfig"))
        self.co = client.CustomObjectsApi(api)
        ctls = self.machines("node-type=controller")
        self.controllers = sorted(hostname(m) for m in ctls if not m["metadata"].get("deletionTimestamp"))
        if len(self.controllers) < 2:
            raise SystemExit("soak: the lab needs two controllers in HA (LAB_CONTROLLERS=2 LAB_HA=1); it has %s"
                             % (", ".join(self.controllers) or "none"))
        self.primary = self.controllers[0]
        self.last_error = ""

    def sh(self, *cmd, timeout=600, check=False):
        proc = subprocess.run(list(cmd), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout,
                              check=False)
        if check and proc.returncode:
            raise RuntimeError("%s failed (%d): %s %s"
                               % (" ".join(cmd), proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))
        return proc

    def on(self, machine, command, timeout=60):
        return self.sh("podman", "exec", machine, "bash", "-c", command, timeout=timeout)

    def slurm(self, command, timeout=60, once=False):
        """A Slurm command's output on a controller whose machine runs (the primary first); None if none answered.
        once: asked on the first controller machine that runs only, as a user would (a submission that failed
        there may still have been taken: asking again elsewhere could submit it twice)."""
        errors = []
        running = self.running_containers() if once else set(self.controllers)
        for ctl in [c for c in self.controllers if c in running] or self.controllers[:1]:
            try:
                proc = self.on(ctl, command, timeout=timeout)
            except subprocess.TimeoutExpired:
                errors.append("%s: no answer in %d s" % (ctl, timeout))
                if once:
                    break
                continue
            if proc.returncode == 0:
                return proc.stdout
            errors.append("%s: %s" % (ctl, " ".join((proc.stderr or proc.stdout).split())[:200]))
            if once:
                break
        self.last_error = "; ".join(errors)
        return None

    def machines(self, selector=None, timeout=5):
        items = self.co.list_namespaced_custom_object(G, V, NS, "machines", label_selector=selector or "",
                                                      _request_timeout=timeout)["items"]
        return items

    def compute_machines(self, timeout=5):
        return self.machines("cluster.x-k8s.io/deployment-name=" + self.md, timeout)

    def slurm_nodes(self):
        """{node: state} of Slurm's nodes, or None when no controller answered."""
        out = self.slurm("sinfo --noheader --Node --format '%N %T'", timeout=20)
        if out is None:
            return None
        return dict(line.split()[:2] for line in out.splitlines() if line.strip())

    def set_replicas(self, n):
        self.co.patch_namespaced_custom_object_scale(G, V, NS, "machinedeployments", self.md,
                                                     {"spec": {"replicas": n}}, _request_timeout=10)

    def running_containers(self):
        out = self.sh("podman", "ps", "--filter", "label=converged.hpc.lab=" + self.name, "--format",
                      "{{.Names}}").stdout
        return set(out.split())

    def all_containers(self):
        out = self.sh("podman", "ps", "-a", "--filter", "label=converged.hpc.lab=" + self.name, "--format",
                      "{{.Names}}").stdout
        return set(out.split())

    def apiserver_pid(self):
        out = self.sh("pgrep", "-f", "kube-apiserver .*--secure-port=%d( |$)" % self.api_port).stdout.split()
        if len(out) != 1:
            raise RuntimeError("soak: expected one kube-apiserver on port %d, found pids %s" % (self.api_port, out))
        return int(out[0])

    def events_running(self):
        pidfile = os.path.join(self.state, "events", "rulebook.pid")
        if not os.path.exists(pidfile):
            return False
        with open(pidfile) as fh:
            pid = fh.read().strip()
        return bool(pid) and os.path.exists("/proc/%s" % pid)

    def reconcile_args(self):
        return ["ansible-playbook", "-i", os.path.join(self.state, "capi.capi_machines.yml"),
                os.path.join("playbooks", "reconcile.yml")]


def hostname(machine):
    for address in (machine.get("status") or {}).get("addresses") or []:
        if address["type"] == "Hostname":
            return address["address"]
    return None


class Soak:
    def __init__(self, lab, seed, seconds, replicas, hold_limit, out=sys.stdout, without=()):
        self.lab, self.seed, self.seconds, self.replicas, self.hold_limit = lab, seed, seconds, replicas, hold_limit
        self.schedule = make_schedule(seed, seconds, replicas, without=without)
        self.job_plan = make_jobs(seed, seconds)
        self.out = out
        self.t0 = None
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.jobs = {}  # job id -> kind
        self.submitted = {}  # job id -> seconds into the run sbatch answered
        self.refused = []  # (at, kind, why): sbatch refused (no controller answered): the user saw it
        self.held_since = {}  # Machine -> when it was first seen held with its node out of Slurm
        self.holds = {}  # Machine -> the longest time it was seen so
        self.over = []  # (Machine, seconds): held longer than hold_limit
        self.faults = []  # what was done, when
        self.duplicates = []  # the reconcile runs started by hand: Popen
        self.outages = []  # (when to undo, what, undo function)
        self.started_events = False

    def say(self, msg):
        at = time.time() - self.t0 if self.t0 else 0.0
        print("[soak %7.1fs] %s" % (at, msg), file=self.out, flush=True)

    # ----------------------------------------------------------------- the jobs
    def submit_jobs(self):
        for at, kind, args in self.job_plan:
            if self.wait_until(at):
                return
            # (a client that reaches the backup while it is taking control sleeps SlurmctldTimeout / 2, 60 s by
            # default, then asks again: docs/ha.md; it is given that and more)
            # a time limit, as a site's jobs have: without one, backfill cannot start a short job beside a
            # two-node job that waits, and in an hour's run the queue backed up behind them (140 jobs)
            out = self.lab.slurm("sbatch --parsable --requeue --time=5 --output=/dev/null --job-name=soak-%s %s"
                                 % (kind, args), timeout=180, once=True)
            if out is None:
                self.refused.append((round(time.time() - self.t0, 1), kind, self.lab.last_error))
                self.say("sbatch %s refused (the user sees the error; not a lost job): %s" % (kind, self.lab.last_error))
                continue
            job = out.strip().split(";")[0]
            with self.lock:
                self.jobs[job] = kind
                self.submitted[job] = round(time.time() - self.t0, 1)

    def window(self, job):
        """Why a job Slurm has no record of may be gone: accepted just before the primary's machine was killed,
        within the state-save window docs/ha.md documents (the backup loads state saved before it)."""
        at = self.submitted.get(job)
        kills = [f["when"] for f in self.faults if f["kind"] == "primary" and f["done"] and at is not None
                 and 0 <= f["when"] - at <= WINDOW_SECONDS]
        return (" (accepted %.1f s before the primary's machine was killed: the state-save window, docs/ha.md)"
                % (kills[0] - at)) if kills else ""

    def wait_until(self, at):
        """Sleep until `at` seconds into the run; True when the run is stopping."""
        return self.stop.wait(max(0.0, self.t0 + at - time.time()))

    # ----------------------------------------------------------------- the hook watch
    def watch(self):
        while not self.stop.wait(2):
            self.look()

    def look(self):
        try:
            machines = self.lab.compute_machines(timeout=5)
        except Exception:  # pylint: disable=broad-except  # the API may be stopped: look again later
            return
        leaving = [m for m in machines
                   if m["metadata"].get("deletionTimestamp") and HOOK in m["metadata"].get("annotations", {})]
        # Slurm is asked only while a Machine leaves with our hook (a podman exec every 2 s costs the labs beside)
        nodes = self.lab.slurm_nodes() if leaving else {}
        if nodes is None:
            return
        now = time.time()
        held = set()
        for m in leaving:
            name = m["metadata"]["name"]
            if hostname(m) in nodes:
                continue  # still in Slurm (draining): the hook is there for that
            held.add(name)
            since = self.held_since.setdefault(name, now)
            self.holds[name] = max(self.holds.get(name, 0.0), now - since)
        for name in set(self.held_since) - held:
            del self.held_since[name]
        for name, seconds in self.holds.items():
            if seconds > self.hold_limit and name not in dict(self.over):
                self.over.append((name, round(seconds, 1)))
                self.say("Machine %s held %.0f s after its node left Slurm (limit %d s)"
                         % (name, seconds, self.hold_limit))

    # ----------------------------------------------------------------- the faults
    def compute_nodes(self, nodes=None):
        nodes = self.lab.slurm_nodes() if nodes is None else nodes
        return sorted(n for n in (nodes or {}) if n not in self.lab.controllers)

    @staticmethod
    def pick(items, fraction):
        return items[min(int(fraction * len(items)), len(items) - 1)] if items else None

    def outage_on(self, what):
        return any(outage[1] == what for outage in self.outages)

    def do(self, step):
        kind = step["kind"]
        lab = self.lab
        if kind == "scale":
            lab.set_replicas(step["replicas"])
            return "replicas %d" % step["replicas"]
        if kind == "burst":
            first, second = step["replicas"]
            lab.set_replicas(first)
            time.sleep(0.5)
            lab.set_replicas(second)
            return "replicas %d then %d within a second" % (first, second)
        if kind == "slurmd":
            node = self.pick([n for n in self.compute_nodes() if n in lab.running_containers()], step["pick"])
            if not node:
                return None
            lab.on(node, "pkill -KILL -x slurmd")
            return "slurmd killed on %s" % node
        if kind == "power":
            if self.outage_on("power"):
                return None
            running = lab.running_containers()
            node = self.pick([n for n in self.compute_nodes() if n in running], step["pick"])
            if not node:
                return None
            lab.sh("podman", "kill", node)
            self.outages.append((time.time() + step["for"], "power", lambda: self.power_on(node)))
            return "%s powered off for %.0f s" % (node, step["for"])
        if kind == "primary":
            if self.outage_on("primary") or lab.primary not in lab.running_containers():
                return None
            lab.sh("podman", "kill", lab.primary)
            self.outages.append((time.time() + step["for"], "primary", self.primary_on))
            return "primary controller %s killed for %.0f s" % (lab.primary, step["for"])
        if kind == "api":
            if self.outage_on("api"):
                return None
            pid = lab.apiserver_pid()
            os.kill(pid, signal.SIGSTOP)
            self.outages.append((time.time() + step["for"], "api", lambda: os.kill(pid, signal.SIGCONT)))
            return "management cluster's API stopped for %.0f s" % step["for"]
        if kind == "events":
            if self.outage_on("events"):
                return None
            lab.sh("lab/lab.sh", "events-stop")
            self.outages.append((time.time() + step["for"], "events",
                                 lambda: lab.sh("lab/lab.sh", "events", check=True)))
            return "event path stopped (its reconcile with it) for %.0f s" % step["for"]
        if kind == "duplicate":
            log = os.path.join(lab.state, "logs", "soak-duplicate-%d.log" % (len(self.duplicates) + 1))
            with open(log, "w") as fh:
                self.duplicates.append(subprocess.Popen(lab.reconcile_args(), cwd=REPO, env=lab.env, stdout=fh,
                                                        stderr=subprocess.STDOUT, start_new_session=True))
            return "reconcile.yml started by hand beside the event path (%s)" % os.path.basename(log)
        raise ValueError("soak: unknown step kind %r" % kind)

    def power_on(self, node):
        """On again, unless its Machine went meanwhile: a host being deprovisioned stays off (the host agent
        removes its machine)."""
        if node not in self.lab.all_containers():
            return "gone meanwhile (its Machine deleted, its host deprovisioned)"
        for attempt in range(30):  # the API may be stopped by another fault: try a minute
            try:
                machine = next((m for m in self.lab.compute_machines() if hostname(m) == node), None)
                break
            except Exception:  # pylint: disable=broad-except
                time.sleep(2)
        else:
            machine = None
        if machine is None or machine["metadata"].get("deletionTimestamp"):
            return "left off: its Machine is being deleted or gone"
        self.lab.sh("podman", "start", node)
        return "powered on"

    def primary_on(self):
        self.lab.sh("podman", "start", self.lab.primary, check=True)
        return "started"

    def undo_due(self, everything=False):
        for proc in self.duplicates:
            proc.poll()  # collected when it ends, as AWX's runner collects its jobs
        # the API first: another fault's undo may ask it (a machine powered on asks for its Machine), and
        # would wait on the soak itself while the API it stopped is due back after it
        for entry in sorted(self.outages, key=lambda e: (e[1] != "api", e[0])):
            when, what, undo = entry
            if not (everything or when <= time.time()):
                continue
            if what == "power" and self.outage_on("api") and not everything:
                continue  # its turn comes once the API is back
            self.outages.remove(entry)
            result = undo()
            self.say("%s: back (%s)" % (what, result if isinstance(result, str) else "done"))

    # ----------------------------------------------------------------- the run
    def run(self):
        lab = self.lab
        self.t0 = time.time()
        self.say("seed %d, %d s of faults, replicas %d-%d, hold limit %d s; schedule: %s"
                 % (self.seed, self.seconds, self.replicas[0], self.replicas[1], self.hold_limit,
                    json.dumps(self.schedule)))
        if not lab.events_running():
            lab.sh("lab/lab.sh", "events", check=True)
            self.started_events = True
            self.say("event path started")
        threads = [threading.Thread(target=self.submit_jobs, daemon=True),
                   threading.Thread(target=self.watch, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            for step in self.schedule:
                while time.time() < self.t0 + step["at"]:
                    self.undo_due()
                    time.sleep(0.5)
                try:
                    done = self.do(step)
                except Exception as exc:  # pylint: disable=broad-except  # e.g. the API stopped by a fault
                    done = None
                    self.say("%s: could not be done now (%s)" % (step["kind"], str(exc).splitlines()[0][:200]))
                self.faults.append(dict(step, done=done, when=round(time.time() - self.t0, 1)))
                self.say("%s: %s" % (step["kind"], done or "skipped (no node to do it on, or the same outage is on)"))
            while time.time() < self.t0 + self.seconds:
                self.undo_due()
                time.sleep(0.5)
        finally:
            self.undo_due(everything=True)
        self.stop.set()
        for thread in threads:
            thread.join(120)
        return self.settle()

    def settle(self):
        """After the faults: every job final, then reconcile.yml twice; the figures; the problems found."""
        lab = self.lab
        problems = []
        self.say("faults over; %d jobs submitted; waiting for them to end" % len(self.jobs))
        if not self.wait_primary(300):
            problems.append("the primary controller %s did not take control back within 300 s of its start"
                            % lab.primary)
        if not lab.events_running():
            lab.sh("lab/lab.sh", "events", check=True)
        # the most nodes the run allows: what waits (two-node jobs too) runs, and the last drains are quick
        lab.set_replicas(max(2, self.replicas[1]))
        # 15 minutes, and as long as jobs keep ending: an hour's queue drains at the pace the nodes run it
        deadline = time.time() + 900
        self.stop.clear()
        watcher = threading.Thread(target=self.watch, daemon=True)
        watcher.start()
        records = {}
        ended = 0
        while time.time() < deadline:
            records = self.accounting()
            if records is not None and all(r["final"] for r in records.values()) and \
                    set(self.jobs) <= {r["job"] for r in records.values()}:
                break
            final = sum(1 for r in (records or {}).values() if r["final"])
            if final > ended:
                ended = final
                deadline = max(deadline, time.time() + 300)
            time.sleep(5)
        for proc in self.duplicates:
            proc.wait(600)
        # a backup that shut itself down in a failback leaves the next primary failure with no controller
        if not self.wait_controllers(120):
            problems.append("not every controller's slurmctld answers after the faults: %s" % " | ".join(
                (lab.slurm("scontrol ping", timeout=20) or "no answer").split("\n")[:4]))
        lost = sorted(job for job, r in (records or {}).items() if r["state"] != "COMPLETED" or r["code"] != "0:0")
        missing = sorted(set(self.jobs) - {r["job"] for r in (records or {}).values()}, key=int)
        requeued = sorted(job for job, r in (records or {}).items() if r["runs"] > 1)
        # a submission that timed out may still have been taken: the soak's jobs accounting has that it does not
        unknown = self.unlisted()
        if lost or missing:
            problems.append("jobs lost: %s; no final record: %s" % (
                ", ".join("%s (%s %s)" % (j, records[j]["state"], records[j]["code"]) for j in lost) or "none",
                ", ".join("%s%s" % (j, self.window(j)) for j in missing) or "none"))
        # the Machines follow the replicas: each one gone or live, none held
        self.wait_quiet(600)
        self.stop.set()
        watcher.join(30)
        if self.over:
            problems.append("held longer than %d s after their nodes left Slurm: %s" % (
                self.hold_limit, ", ".join("%s %.0f s" % o for o in self.over)))
        # the checking runs alone: the event path stopped (and started again below if it ran before the soak)
        lab.sh("lab/lab.sh", "events-stop")
        first = lab.sh(*lab.reconcile_args(), timeout=900)
        agree = self.agreement()
        second = lab.sh(*lab.reconcile_args(), timeout=900)
        if first.returncode:
            problems.append("the reconcile after the faults failed:\n" + first.stdout[-3000:])
        if agree:
            problems.append("after one reconcile, Slurm and Cluster API differ: " + agree)
        if second.returncode or "reconcile: nothing to do" not in second.stdout:
            problems.append("the second reconcile had something to do:\n" + second.stdout[-3000:])
        if not self.started_events:
            lab.sh("lab/lab.sh", "events", check=True)
        figures = {
            "seed": self.seed, "seconds": self.seconds, "replicas": list(self.replicas),
            "faults": {k: sum(1 for f in self.faults if f["kind"] == k and f["done"]) for k in sorted(KINDS)},
            "skipped": sum(1 for f in self.faults if not f["done"]),
            "jobs": len(self.jobs), "jobs_by_kind": {k: sum(1 for v in self.jobs.values() if v == k)
                                                     for k in sorted(JOBS)},
            "array_tasks": sum(1 for r in (records or {}).values() if "_" in r["id"]),
            "completed": sum(1 for r in (records or {}).values() if r["state"] == "COMPLETED" and r["code"] == "0:0"),
            "requeued": requeued, "lost": lost, "no_final_record": missing,
            "refused_at_submission": self.refused,
            "accepted_though_sbatch_failed": unknown,
            "longest_hold_s": round(max(self.holds.values(), default=0.0), 1),
            "longest_holds": sorted(([name, round(sec, 1)] for name, sec in self.holds.items()),
                                    key=lambda h: -h[1])[:3],
            "duplicate_runs": [p.returncode for p in self.duplicates],
            "problems": problems, "schedule": self.faults,
        }
        with open(os.path.join(lab.state, "logs", "soak.json"), "w") as fh:
            json.dump(figures, fh, indent=1)
        return figures

    def accounting(self):
        """{job id as sacct names it: {job, id, state, code, runs, final}} of the soak's jobs, or None."""
        with self.lock:
            ids = sorted(self.jobs, key=int)
        if not ids:
            return {}
        out = self.lab.slurm("sacct --noheader --parsable2 --allocations --duplicates --starttime now-1days "
                             "--jobs %s --format JobID,State,ExitCode" % ",".join(ids), timeout=60)
        if out is None:
            return None
        records = {}
        for line in out.splitlines():
            if not line.strip():
                continue
            jid, state, code = line.split("|")[:3]
            job = jid.split("_")[0]
            entry = records.setdefault(jid, {"job": job, "id": jid, "runs": 0})
            entry["runs"] += 1
            # the last record of a job (its latest run) is its state now
            entry.update(state=state.split()[0], code=code, final=state.split()[0] not in UNFINISHED)
        return records

    def unlisted(self):
        """The soak's jobs (by name) accounting has and the soak does not: sbatch failed, yet the job was taken."""
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.t0))
        out = self.lab.slurm("sacct --noheader --parsable2 --allocations --allusers --starttime %s "
                             "--format JobID,JobName,State,Submit" % since, timeout=60) or ""
        with self.lock:
            known = set(self.jobs)
        found = []
        for line in out.splitlines():
            fields = line.split("|")
            # submitted during this run (the clocks of the lab are this machine's), by the soak, not known to it
            if len(fields) >= 4 and fields[1].startswith("soak-") and fields[3] >= since \
                    and fields[0].split("_")[0] not in known:
                found.append("%s %s %s" % tuple(fields[:3]))
        return found

    def wait_ping(self, timeout, answered):
        """Until answered(what `scontrol ping` says) is true (False after timeout seconds)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if answered(self.lab.slurm("scontrol ping", timeout=20) or ""):
                return True
            time.sleep(2)
        return False

    def wait_primary(self, timeout):
        """Until the primary controller, started again, is in control (Slurm gives it back to the primary)."""
        return self.wait_ping(timeout, lambda out: re.search(
            r"\(primary\) at %s is UP" % re.escape(self.lab.primary), out))

    def wait_controllers(self, timeout):
        """Until every controller's slurmctld answers `scontrol ping` (the primary in control, the backups in
        standby)."""
        return self.wait_ping(timeout, lambda out: len(re.findall(r" is UP", out)) >= len(self.lab.controllers))

    def wait_quiet(self, timeout):
        """Until no compute Machine is being deleted and each live one is a node (or timeout)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                machines = self.lab.compute_machines()
            except Exception:  # pylint: disable=broad-except
                machines = None
            nodes = self.lab.slurm_nodes()
            if machines is not None and nodes is not None \
                    and not any(m["metadata"].get("deletionTimestamp") for m in machines) \
                    and {hostname(m) for m in machines} == set(self.compute_nodes(nodes)):
                return True
            time.sleep(3)
        return False

    def agreement(self):
        """What differs between Slurm's compute nodes and the live compute Machines; "" when they agree."""
        machines = self.lab.compute_machines(timeout=10)
        nodes = self.lab.slurm_nodes() or {}
        live = {hostname(m) for m in machines if not m["metadata"].get("deletionTimestamp")}
        compute = {n: s for n, s in nodes.items() if n not in self.lab.controllers}
        diffs = []
        if any(m["metadata"].get("deletionTimestamp") for m in machines):
            diffs.append("Machines still being deleted: %s" % sorted(
                m["metadata"]["name"] for m in machines if m["metadata"].get("deletionTimestamp")))
        if set(compute) != live:
            diffs.append("Slurm's nodes %s, the live Machines' hosts %s" % (sorted(compute), sorted(live)))
        busy = {n: s for n, s in compute.items() if s != "idle"}
        if busy:
            diffs.append("nodes not idle: %s" % busy)
        return "; ".join(diffs)


def replicas_range(text):
    found = re.fullmatch(r"(\d+)-(\d+)", text)
    if not found or int(found.group(1)) > int(found.group(2)) or int(found.group(1)) < 1:
        raise argparse.ArgumentTypeError("--replicas %r: give LOW-HIGH, 1 <= LOW <= HIGH (e.g. 1-4)" % text)
    return int(found.group(1)), int(found.group(2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    ap.add_argument("--seed", type=int, default=None, help="the schedule's seed (default: a new one, printed)")
    ap.add_argument("--minutes", type=float, default=10.0, help="how long faults come (default 10)")
    ap.add_argument("--replicas", type=replicas_range, default=(1, 4), help="the compute replicas range (1-4)")
    ap.add_argument("--hold-limit", type=int, default=300,
                    help="seconds a Machine may stay held by our hook after its node left Slurm (300)")
    ap.add_argument("--without", action="append", default=[], choices=sorted(KINDS),
                    help="a kind of fault left out (again for more)")
    ap.add_argument("--schedule", action="store_true", help="print the schedule of this seed and stop")
    args = ap.parse_args(argv)
    if args.minutes <= 0:
        ap.error("--minutes %r: give a positive number" % args.minutes)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10 ** 6)
    seconds = int(args.minutes * 60)
    if args.schedule:
        print(json.dumps({"seed": seed, "faults": make_schedule(seed, seconds, args.replicas, without=args.without),
                          "jobs": make_jobs(seed, seconds)}, indent=1))
        return 0
    soak = Soak(Lab(), seed, seconds, args.replicas, args.hold_limit, without=args.without)
    figures = soak.run()
    print(json.dumps({k: v for k, v in figures.items() if k != "schedule"}, indent=1))
    if figures["problems"]:
        print("soak FAILED (seed %d; replay: python3 tests/soak.py --seed %d --minutes %g --replicas %d-%d):\n%s\n"
              "the schedule as it ran: %s" % (seed, seed, args.minutes, args.replicas[0], args.replicas[1],
                                              "\n".join(figures["problems"]), json.dumps(figures["schedule"])))
        return 1
    print("soak passed (seed %d): %d jobs, 0 lost" % (seed, figures["jobs"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
