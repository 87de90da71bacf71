"""Benchmark: the elastic lifecycle in a lab of its own (prebaked image).

(a) scale-up latency per batch of 1, 5 and 10 new Machines: from every new Machine
    being Provisioned (a Slurm host never becomes Running: no Node) to
    every new node IDLE in Slurm (scale_up.yml, as AWX would run it);
(b) scale-down overhead on idle nodes: from the deletionTimestamp (Machines held
    by our pre-terminate hook) to the hook released (scale_down.yml), and on to
    the Machines gone.

(c) with --events: the same through the event path (lab/lab.sh events: ansible-rulebook,
    the capi_machines source, reconcile.yml) with nobody running a playbook - Provisioned
    -> every new node IDLE, deletionTimestamp -> Machines gone - and a burst of --burst
    Machines at once (default 50): how many reconcile runs it started.

(d) with --join-at-boot: the same scale-ups with the compute MachineDeployment's new Machines
    joining Slurm at their first boot (playbooks/join_at_boot.yml, its template naming the Secret):
    from the scale command, and from Provisioned, to every new node IDLE, with no playbook run;
    then scale_up.yml as the Machine event would run it (it finds nothing to converge). The lab's
    BareMetalHosts report more memory than the machines show, as real ones do (LAB_RAM_MIB).

(e) with --waiting-job N: N rounds, each way: a job that needs one node more than Slurm has waits; the
    compute MachineDeployment gets one more Machine (scale_up.yml); from the new node IDLE on the
    controller to the job RUNNING, polled there every 0.1 s: with the slurmd unit's ready script asking
    slurmctld to schedule (slurm_compute_ready_timeout, the default) and without it (0: Slurm's own cycles).

    python3 bench/elastic.py [--batches 1,5,10] [--events] [--burst 50] [--join-at-boot] [--waiting-job 3]

On the real management cluster (kube-apiserver, Cluster API, CAPM3 and the Bare Metal Operator): the lab
registers as many compute hosts as the largest scale needs.

Anchors printed beside them: 38.74 s per node with a prebaked image and 267.59 s
with a stock one, as measured in the thesis this project follows.
"""

import argparse
import os
import re
import subprocess
import sys
import time

from kubernetes import client, config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, LAB_NAME="ebench", LAB_SUBNET_PREFIX="10.89.90", LAB_API_PORT="16490",
           LAB_STATE=".lab/ebench", LAB_FLAVOUR="prebaked", LAB_CONTROLLERS="1", LAB_COMPUTE="1", LAB_DIRECTORY="0",
           CONTAINERS_CONF=os.path.join(REPO, "lab", "containers.conf"),
           ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))


def sh(*cmd):
    proc = subprocess.run(list(cmd), cwd=REPO, env=ENV, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit("%s failed:\n%s\n%s" % (" ".join(cmd), proc.stdout[-2000:], proc.stderr[-2000:]))
    return proc.stdout


def scale(n):
    t0 = time.time()
    out = sh("python3", "lab/scale.py", str(n))
    total = time.time() - t0
    up = re.search(r"scale_up.yml done in ([\d.]+) s", out)
    down = re.search(r"scale_down.yml done in ([\d.]+) s", out)
    gone = re.search(r"\[lab-scale +([\d.]+)s\] Machines gone", out)
    held = re.search(r"\[lab-scale +([\d.]+)s\] Deleting", out)
    return total, up, down, gone, held


def profile(log_name, top=8):
    """Where a playbook run's seconds went: its host's task count and the slowest tasks (profile_tasks'
    recap in the lab's log of the run)."""
    path = os.path.join(REPO, ENV["LAB_STATE"], "logs", log_name)
    with open(path, errors="replace") as log:
        text = log.read()
    recap = text[text.rindex("PLAY RECAP"):]
    hosts = re.findall(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+).*?skipped=(\d+)", recap, re.M)
    slowest = re.findall(r"^(.+?) -+ ([\d.]+)s$", recap[recap.find("TASKS RECAP"):], re.M)[:top]
    lines = ["  %s: %s tasks run, %s skipped" % (h, ok, skipped) for h, ok, dummy, skipped in hosts if int(ok) > 10]
    lines += ["  %6.2f s  %s" % (float(t), name[:100]) for name, t in slowest]
    return "\n".join(lines)


def reconcile_runs():
    """How many reconcile.yml runs the event path has started (its log, .lab/ebench/logs/events.log)."""
    path = os.path.join(REPO, ENV["LAB_STATE"], "logs", "events.log")
    if not os.path.exists(path):
        return 0
    with open(path, errors="replace") as log:
        return log.read().count("PLAY [What differs between Cluster API and Slurm]")


def wait_runs_settle(quiet=20, timeout=900):
    """Until no new reconcile run has started for `quiet` seconds (and none is running)."""
    deadline, last, since = time.time() + timeout, reconcile_runs(), time.time()
    while time.time() < deadline:
        time.sleep(2)
        now = reconcile_runs()
        running = subprocess.run(["pgrep", "-f", "playbooks/reconcile.yml"], capture_output=True,
                                 check=False).returncode == 0
        if now != last or running:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            return now
    return reconcile_runs()


def events(batches, replicas, burst):
    """(c): the event path does the work; scale.py only changes the replicas and waits."""
    sh("lab/lab.sh", "events")
    try:
        wait_runs_settle()  # its initial reconcile
        for batch in batches:
            replicas += batch
            out = sh("python3", "lab/scale.py", str(replicas))
            idle = float(re.search(r"IDLE ([\d.]+) s after Provisioned", out).group(1))
            print("event path +%-3d Provisioned -> all IDLE %6.1f s (%5.1f s per node)" % (batch, idle, idle / batch),
                  flush=True)
        out = sh("python3", "lab/scale.py", "1")
        gone = float(re.search(r"Machines gone ([\d.]+) s after Deleting", out).group(1))
        print("event path -%-3d deletionTimestamp -> Machines gone %6.1f s" % (replicas - 1, gone), flush=True)
        before = wait_runs_settle()
        t0 = time.time()
        out = sh("python3", "lab/scale.py", str(1 + burst))
        idle = float(re.search(r"IDLE ([\d.]+) s after Provisioned", out).group(1))
        runs = wait_runs_settle() - before
        print("event path +%-3d at once: %d reconcile run(s) started; all IDLE %.1f s after Provisioned "
              "(%.1f s from the scale command)" % (burst, runs, idle, time.time() - t0), flush=True)
        sh("lab/lab.sh", "events-stop")
        sh("python3", "lab/scale.py", "1")
    finally:
        sh("lab/lab.sh", "events-stop")


def join_at_boot(batches, replicas):
    """(d): the new Machines join at their first boot; nobody runs a playbook before they are IDLE."""
    state = os.path.join(REPO, ENV["LAB_STATE"])
    sh("ansible-playbook", "-i", os.path.join(state, "capi.capi_machines.yml"), "playbooks/join_at_boot.yml",
       "-e", '{"converged_join_at_boot": ["ebench-compute"]}')
    api = config.new_client_from_config(os.path.join(state, "capi", "kubeconfig"))
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", "ebench-compute",
        {"spec": {"template": {"spec": {"bootstrap": {"dataSecretName": "ebench-compute-join"}}}}})
    for batch in batches:
        replicas += batch
        out = sh("python3", "lab/scale.py", str(replicas), "--wait-idle")
        found = re.search(r"IDLE (-?[\d.]+) s after Provisioned, ([\d.]+) s after the scale", out)
        after, total = float(found.group(1)), float(found.group(2))
        t0 = time.time()
        sh("ansible-playbook", "-i", os.path.join(state, "capi.capi_machines.yml"), "playbooks/scale_up.yml")
        print("join at boot +%-3d scale command -> all IDLE %6.1f s (Provisioned -> IDLE %5.1f s); "
              "scale_up.yml afterwards %5.1f s" % (batch, total, after, time.time() - t0), flush=True)
    sh("python3", "lab/scale.py", "1")


# on the controller: every 0.1 s, the time, the nodes IDLE and the job's state, until the job runs
WATCH = ("while :; do i=$(sinfo --noheader --Node --states=idle --format=%%N | sort -u | wc -l); "
         "j=$(squeue --noheader --job %s --format=%%T); echo \"$(date +%%s.%%N) $i $j\"; "
         "case \"$j\" in PENDING) ;; *) break ;; esac; sleep 0.1; done")


def waiting_job(rounds, replicas):
    """(e): node IDLE -> the job that waited for it RUNNING, with and without the ready script."""
    figures = {}
    for variant, extra in [("Slurm's own cycles (slurm_compute_ready_timeout=0)", ["-e", "slurm_compute_ready_timeout=0"]),
                           ("the ready script asks slurmctld to schedule", [])] * rounds:
        job = sh("podman", "exec", ENV["LAB_NAME"] + "-ctl-01", "sbatch", "--parsable", "--nodes=%d" % (replicas + 1),
                 "--wrap", "sleep 1").strip()
        idle_before = int(sh("podman", "exec", ENV["LAB_NAME"] + "-ctl-01", "sh", "-c",
                             "sinfo --noheader --Node --states=idle --format=%N | sort -u | wc -l").strip())
        watch = subprocess.Popen(["podman", "exec", ENV["LAB_NAME"] + "-ctl-01", "sh", "-c", WATCH % job], cwd=REPO, env=ENV,
                                 stdout=subprocess.PIPE, text=True)
        sh("python3", "lab/scale.py", str(replicas + 1), *extra)
        out, dummy = watch.communicate(timeout=180)
        samples = [line.split(None, 2) + [""] for line in out.splitlines() if line.strip()]
        idle = next(float(t) for t, n, *rest in samples if int(n) > idle_before)
        running = next(float(t) for t, n, state, *rest in samples if state.strip() and state.strip() != "PENDING")
        figures.setdefault(variant, []).append(running - idle)
        print("waiting job: %-52s new node IDLE -> job RUNNING %5.1f s" % (variant, running - idle), flush=True)
        sh("python3", "lab/scale.py", str(replicas))
    for variant, values in figures.items():
        print("waiting job: %-52s median %5.1f s (%s)" % (variant, sorted(values)[len(values) // 2],
                                                          ", ".join("%.1f" % v for v in values)), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,5,10")
    ap.add_argument("--events", action="store_true", help="also measure the event path (c)")
    ap.add_argument("--burst", type=int, default=50, help="Machines at once for the event path's job count")
    ap.add_argument("--join-at-boot", action="store_true", help="also measure the join at first boot (d)")
    ap.add_argument("--waiting-job", type=int, default=0, metavar="ROUNDS",
                    help="also measure node IDLE -> a waiting job RUNNING, ROUNDS times each way (e)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.join_at_boot:  # Metal3 reports the memory installed, more than the OS shows (docs/slurm.md)
        ENV["LAB_RAM_MIB"] = "1048576"
    ENV["LAB_COMPUTE_HOSTS"] = str(1 + max(sum(batches), args.burst if args.events else 0))
    run(args, batches)


def run(args, batches):
    print("elastic benchmark (the real Cluster API, CAPM3 and Bare Metal Operator): lab 'ebench', 1 controller + "
          "1 compute to start, prebaked image", flush=True)
    sh("lab/lab.sh", "down")
    sh("make", "-s", "dev-collection")
    sh("lab/lab.sh", "up")
    sh("lab/lab.sh", "mgmt")
    sh("lab/lab.sh", "converge")
    rows = []
    replicas = 1
    try:
        for batch in batches:
            replicas += batch
            total, up = scale(replicas)[:2]
            rows.append(("up", batch, float(up.group(1)), total))
            print("scale-up   +%-3d Provisioned -> all IDLE %6.1f s (%5.1f s per node; with boot %6.1f s)"
                  % (batch, float(up.group(1)), float(up.group(1)) / batch, total), flush=True)
            if batch == 1:  # where the seconds of one node's scale-up go
                print(profile("scale_up.log"), flush=True)
        leaving = replicas - 1
        total, dummy, down, gone, held = scale(1)
        print("scale-down -%-3d deletionTimestamp -> hooks released %6.1f s (%4.1f s per node); "
              "Machines gone after %5.1f s" % (leaving, float(down.group(1)), float(down.group(1)) / leaving,
                                               float(gone.group(1)) - float(held.group(1))), flush=True)
        print(profile("scale_down.log"), flush=True)
        if args.events:
            events(batches, 1, args.burst)
        if args.join_at_boot:
            join_at_boot(batches, 1)
        if args.waiting_job:
            waiting_job(args.waiting_job, 1)
    finally:
        sh("lab/lab.sh", "down")
    print("anchors (thesis): 38.74 s per node with a prebaked image, 267.59 s with a stock image")


if __name__ == "__main__":
    main()
