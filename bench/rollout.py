"""Benchmark: a new node image rolled over a busy 4-node cluster (playbooks/rollout.yml), in a lab of its own
(tests/e2e/labkit.py brings it up: 4 compute Machines on 4 hosts, no spare, joining Slurm at their first boot,
the real Cluster API, CAPM3 and Bare Metal Operator; LAB_DEPROVISION_SECONDS as given).

Each round submits the same busy load (jobs of 30-120 s with time limits, a two-node job, a 4-task array,
then two 150 s jobs with 4-minute limits), then rolls the compute MachineDeployment to a new image build:
first without a deadline, then with --deadline seconds. Printed per round, each measured: the rollout's wall
time; the fewest compute nodes in service (sampled every 2 s on the controller); the longest a job waited
(its start minus its submission, from sacct); every job's state and exit code; and the longest time limit
running at the start. With --svg the nodes by state over time of both rounds are drawn from the samples.

    python3 bench/rollout.py [--deadline 150] [--svg docs/img/rollout.svg] [--keep]
"""

import argparse
import os
import sys
import threading
import time

from kubernetes import client, config

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "e2e"))
from labkit import Lab  # noqa: E402  pylint: disable=wrong-import-position

LAB = Lab("robench", "10.89.97", 16497, ".lab/robench", LAB_COMPUTE="4", LAB_COMPUTE_HOSTS="4",
          LAB_COMPUTE_JOIN_AT_BOOT="1", LAB_DIRECTORY="0", LAB_RAM_MIB="1048576")
CTL = "robench-ctl-01"
MD = "robench-compute"
INFRA = "infrastructure.cluster.x-k8s.io"
# sinfo's short states, by what a picture shows
SERVING = {"idle": "idle", "alloc": "busy", "mix": "busy", "comp": "busy", "plnd": "idle", "resv": "idle",
           "maint": "idle"}
LOAD = ((120, 1), (90, 1), (60, 2), (45, 1), (30, 1), (100, 1))


def sbatch(args):
    return LAB.on(CTL, "sbatch --parsable --output=/dev/null %s" % args).stdout.strip()


def submit():
    jobs = [sbatch("-N %d --time=%d --wrap 'sleep %d'" % (nodes, seconds // 60 + 2, seconds))
            for seconds, nodes in LOAD]
    jobs.append(sbatch("--array=1-4 --time=2 --wrap 'sleep 40'"))
    jobs += [sbatch("--time=4 --wrap 'sleep 150'") for _index in range(2)]
    return jobs


def kind(state):
    """What a picture shows of a node's short state: idle, busy, draining, or out."""
    base = state.rstrip("-$")
    if base in SERVING:
        return SERVING[base]
    return "draining" if base == "drng" else "out"


def sample(samples, stop, t0):
    while not stop.is_set():
        res = LAB.on(CTL, "sinfo --noheader --Node --partition compute --format '%N %t'", check=False)
        if res.returncode == 0:
            states = dict(line.split() for line in res.stdout.splitlines() if len(line.split()) == 2)
            samples.append((time.time() - t0, states))
        stop.wait(2)


def round_of(name, template, deadline):
    jobs = submit()
    LAB.ask(CTL, "squeue --noheader --states=RUNNING --format %i")
    time.sleep(5)  # the first jobs started
    limits = LAB.ask(CTL, "squeue --noheader --states=RUNNING --format %l").split()
    samples, stop = [], threading.Event()
    t0 = time.time()
    thread = threading.Thread(target=sample, args=(samples, stop, t0), daemon=True)
    thread.start()
    extra = ["converged_rollout_deployment=" + MD, "converged_rollout_template=" + template,
             "converged_rollout_join_timeout=300"] + (["converged_rollout_deadline=%d" % deadline] if deadline else [])
    res = LAB.playbook("rollout.yml", *extra)
    took = time.time() - t0
    stop.set()
    thread.join(30)
    if res.returncode != 0:
        sys.exit("rollout.yml (%s) failed:\n%s" % (name, res.stdout[-4000:]))
    # every job to its end, then what accounting says
    deadline_at = time.time() + 900
    while LAB.on(CTL, "squeue --noheader --format %i", check=False).stdout.strip() and time.time() < deadline_at:
        time.sleep(5)
    rows = LAB.ask(CTL, "sacct --noheader --parsable2 --allocations --format JobID,State,ExitCode,Submit,Start "
                        "--jobs %s" % ",".join(jobs)).splitlines()
    waits, states = [], {}
    for row in rows:
        job, state, code, submitted, started = row.split("|")
        states[(state, code)] = states.get((state, code), 0) + 1
        waits.append(time.mktime(time.strptime(started, "%Y-%m-%dT%H:%M:%S"))
                     - time.mktime(time.strptime(submitted, "%Y-%m-%dT%H:%M:%S")))
    fewest = min(len([s for s in st.values() if kind(s) in ("idle", "busy")]) for _t, st in samples)
    print("%-22s %6.0f s   fewest in service %d of 4   longest wait %4.0f s   jobs %s   longest limit running %s"
          % (name, took, fewest, max(waits), ", ".join("%d %s %s" % (n, s, c) for (s, c), n in sorted(states.items())),
             max(limits) if limits else "none"), flush=True)
    return name, took, samples


COLOURS = {"busy": "#3b7dd8", "idle": "#8fc98f", "draining": "#f0b429", "out": "#d9534f"}


def svg(rounds, path):
    """Nodes by state over time, one band of stacked areas per round, from the samples."""
    width, band, left, top = 760, 150, 60, 30
    longest = max(r[1] for r in rounds)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (left + width + 20, top + len(rounds) * (band + 50) + 30),
           '<text x="%d" y="18" font-size="14">rollout.yml: 4 compute nodes by state over time (bench/rollout.py)</text>'
           % left]
    scale = width / max(longest, 1.0)
    for index, (name, took, samples) in enumerate(rounds):
        y0 = top + index * (band + 50) + 20
        out.append('<text x="%d" y="%d">%s: %.0f s</text>' % (left, y0 - 4, name, took))
        for (t, states), nxt in zip(samples, samples[1:] + [(took, {})]):
            counts = {k: len([s for s in states.values() if kind(s) == k]) for k in COLOURS}
            counts["out"] += max(0, 4 - len(states))  # a node Slurm does not know (between Machines)
            y = y0 + band
            for k in ("busy", "idle", "draining", "out"):
                h = band * counts[k] / 4.0
                if h:
                    out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
                               % (left + t * scale, y - h, max(0.5, (nxt[0] - t) * scale), h, COLOURS[k]))
                y -= h
        for n in range(5):
            out.append('<text x="%d" y="%.0f" text-anchor="end">%d</text>' % (left - 6, y0 + band - band * n / 4 + 4, n))
        for t in range(0, int(longest) + 1, 30):
            out.append('<text x="%.0f" y="%d" text-anchor="middle">%d s</text>' % (left + t * scale, y0 + band + 14, t))
    x = left
    for k, colour in COLOURS.items():
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/><text x="%d" y="%d">%s</text>'
                   % (x, top + len(rounds) * (band + 50) + 4, colour, x + 16, top + len(rounds) * (band + 50) + 15, k))
        x += 90
    out.append("</svg>")
    with open(path, "w") as fh:
        fh.write("\n".join(out) + "\n")
    print("picture: %s" % path)


def make_template(name, build):
    """A copy of the compute template whose image is that build (the host agent reads ?build=)."""
    co = client.CustomObjectsApi(config.new_client_from_config(os.path.join(LAB.state, "capi", "kubeconfig")))
    spec = co.get_namespaced_custom_object(INFRA, "v1beta2", "metal3", "metal3machinetemplates", MD)["spec"]
    image = spec["template"]["spec"]["image"]
    image["url"] = image["url"].split("?")[0] + "?build=" + build
    co.create_namespaced_custom_object(INFRA, "v1beta2", "metal3", "metal3machinetemplates", {
        "apiVersion": INFRA + "/v1beta2", "kind": "Metal3MachineTemplate", "metadata": {"name": name}, "spec": spec})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--deadline", type=int, default=150, help="the second round's deadline (s)")
    parser.add_argument("--svg", help="draw the nodes by state over time there")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    args = parser.parse_args()
    t0 = time.time()
    LAB.up()
    print("lab up and converged in %.0f s (4 compute Machines joining at boot, no spare host)" % (time.time() - t0))
    rounds = []
    try:
        make_template(MD + "-b2", "b2")
        rounds.append(round_of("no deadline", MD + "-b2", 0))
        make_template(MD + "-b3", "b3")
        rounds.append(round_of("deadline %d s" % args.deadline, MD + "-b3", args.deadline))
        if args.svg:
            svg(rounds, args.svg)
    finally:
        if not args.keep:
            LAB.down()


if __name__ == "__main__":
    main()
