"""Scale the lab's compute MachineDeployment (or another node type's: --node-type gpu)
like `kubectl scale`, then run the playbook AWX would run for the event, and report the
timings.

    lab/scale.py REPLICAS [--state .lab] [--cluster clab] [--node-type compute] [--no-playbook]
                       [--wait-idle]


Up:   set replicas; wait until every new Machine is Provisioned; run scale_up.yml.
Down: set replicas; wait until the Machines Cluster API picked are Deleting and
      held by our pre-terminate hook; run scale_down.yml; wait until they are gone.
With the event path running (lab/lab.sh events, which `make lab` starts), nothing
is run by hand: it only changes the replicas and reports when the cluster has
followed by itself (up: every new node IDLE in Slurm; down: the Machines gone).
--wait-idle does the same for Machines that join Slurm at their first boot
(playbooks/join_at_boot.yml): no playbook, up is done when every new node is IDLE.
"""

import argparse
import os
import subprocess
import sys
import time

from kubernetes import client, config

NS = "metal3"
G, V = "cluster.x-k8s.io", "v1beta2"
HOOK_PREFIX = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/"


def log(t0, msg):
    print("[lab-scale %6.1fs] %s" % (time.time() - t0, msg), flush=True)


OWNER_LABEL = {"machinedeployments": "cluster.x-k8s.io/deployment-name", "machinepools": "cluster.x-k8s.io/pool-name"}


def machines(co, md, plural="machinedeployments"):
    items = co.list_namespaced_custom_object(G, V, NS, "machines",
                                             label_selector=OWNER_LABEL[plural] + "=" + md)["items"]
    return {m["metadata"]["name"]: m for m in items}


def wait(t0, what, cond, timeout, poll=0.3, explain=None, every=30):
    """Polls cond until it returns something; says what it still waits for every `every` seconds."""
    end = time.time() + timeout
    said = time.time()
    while time.time() < end:
        value = cond()
        if value:
            return value
        if explain and time.time() - said >= every:
            log(t0, "still waiting for %s: %s" % (what, explain()))
            said = time.time()
        time.sleep(poll)
    log(t0, "gave up waiting for %s%s" % (what, ": " + explain() if explain else ""))
    sys.exit(1)


def machine_state(co, machine):
    """Where a Machine stands, on one line: its phase, its Metal3Machine's readiness, its host's provisioning
    state and its conditions that are not True (left out: the summaries Ready and Available, the Node's, which
    no workload cluster here reports, and Updating, Paused and Deleting, which are False when all is well)."""
    status = machine.get("status") or {}
    said = ["%s %s" % (machine["metadata"]["name"], status.get("phase"))]
    ref = (machine.get("spec") or {}).get("infrastructureRef") or {}
    try:
        infra = co.get_namespaced_custom_object("infrastructure.cluster.x-k8s.io", "v1beta1", NS, "metal3machines",
                                                ref.get("name", ""))
        host = ((infra["metadata"].get("annotations") or {}).get("metal3.io/BareMetalHost") or "/").split("/")[1]
        said.append("Metal3Machine ready=%s" % (infra.get("status") or {}).get("ready"))
        if host:
            bmh = co.get_namespaced_custom_object("metal3.io", "v1alpha1", NS, "baremetalhosts", host)
            said.append("host %s %s" % (host, ((bmh.get("status") or {}).get("provisioning") or {}).get("state")))
    except client.exceptions.ApiException as exc:
        said.append("Metal3Machine %s: %s" % (ref.get("name"), exc.reason))
    said += ["%s=%s(%s)" % (c["type"], c.get("status"), c.get("reason") or "") for c in status.get("conditions") or []
             if c.get("status") != "True" and c["type"] not in (
                 "Ready", "Available", "NodeHealthy", "NodeReady", "Updating", "Paused", "Deleting")]
    return " ".join(said)


def free_hosts(co):
    """The BareMetalHosts no Machine holds, ready to be claimed (a Metal3MachineTemplate's hostSelector may
    still pass some over)."""
    hosts = co.list_namespaced_custom_object("metal3.io", "v1alpha1", NS, "baremetalhosts")["items"]
    return sorted(h["metadata"]["name"] for h in hosts if not (h.get("spec") or {}).get("consumerRef")
                  and ((h.get("status") or {}).get("provisioning") or {}).get("state") in ("available", "ready"))


def playbook(repo, state, name, extra_vars=()):
    cmd = ["ansible-playbook", "-i", os.path.join(state, "capi.capi_machines.yml"),
           os.path.join(repo, "playbooks", name)]
    for ev in extra_vars:
        cmd += ["-e", ev]
    path = os.path.join(state, "logs", name.replace(".yml", ".log"))
    with open(path, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:  # what failed, said here: the log is written again by the next run
        with open(path) as handle:
            failed = [line.rstrip() for line in handle if line.startswith(("fatal:", "failed:", "ERROR!"))]
        print("\n".join(failed[-10:]), flush=True)
    return rc


def events_running(state):
    """The lab's ansible-rulebook (lab/lab.sh events) is alive."""
    try:
        with open(os.path.join(state, "events", "rulebook.pid")) as handle:
            os.kill(int(handle.read().strip()), 0)
        return True
    except (OSError, ValueError):
        return False


def slurm_idle(state):
    """Slurm's IDLE nodes, asked on the lab's first controller machine."""
    with open(os.path.join(state, "machines.tsv")) as handle:
        controller = next(line.split()[0] for line in handle if line.split()[2:3] == ["controller"])
    out = subprocess.run(["podman", "exec", controller, "sinfo", "--noheader", "--Node", "--format", "%N %t"],
                         capture_output=True, text=True, check=False).stdout
    return {n for n, st in (line.split() for line in out.splitlines() if line.strip()) if st == "idle"}


def hostname(machine):
    return next((a["address"] for a in (machine.get("status") or {}).get("addresses") or []
                 if a["type"] == "Hostname"), machine["metadata"]["name"])


def remembered(state):
    """The settings lab/lab.sh up recorded for the lab of state ($LAB_STATE/settings), {} when none."""
    try:
        with open(os.path.join(state, "settings")) as handle:
            return dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    except OSError:
        return {}


def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("replicas", type=int)
    state = os.path.join(repo, os.environ.get("LAB_STATE", ".lab"))
    ap.add_argument("--state", default=state)
    # the lab's name as it was made (lab/lab.sh up writes its settings to the state), unless LAB_NAME says
    ap.add_argument("--cluster", default=os.environ.get("LAB_NAME") or remembered(state).get("LAB_NAME", "clab"))
    ap.add_argument("--node-type", default="compute", help="the node type whose MachineDeployment to scale")
    ap.add_argument("--no-playbook", action="store_true", help="only scale; do not run the playbook")
    ap.add_argument("--wait-idle", action="store_true",
                    help="run no playbook; wait until every new node is IDLE in Slurm (it joins at boot)")
    ap.add_argument("--timeout", type=int, default=600)
    ap.add_argument("-e", "--extra-vars", action="append", default=[], help="passed to ansible-playbook")
    args = ap.parse_args()
    if args.replicas < 0:
        sys.exit("replicas=%d: must be 0 or more" % args.replicas)
    api = config.new_client_from_config(os.path.join(args.state, "capi", "kubeconfig"))
    co = client.CustomObjectsApi(api)
    plural = "machinedeployments"
    md = "%s-%s" % (args.cluster, args.node_type)
    t0 = time.time()
    before = machines(co, md, plural)
    live = {n for n, m in before.items() if not m["metadata"].get("deletionTimestamp")}
    # (a Scale omits spec.replicas when it is 0)
    current = (co.get_namespaced_custom_object_scale(G, V, NS, plural, md).get("spec") or {}).get("replicas", 0)
    kind = "MachineDeployment"
    log(t0, "%s %s/%s: %d -> %d replicas" % (kind, NS, md, current, args.replicas))
    co.patch_namespaced_custom_object_scale(G, V, NS, plural, md,
                                            {"spec": {"replicas": args.replicas}})
    if args.replicas > len(live):
        free = free_hosts(co)
        if len(free) < args.replicas - len(live):
            log(t0, "only %d BareMetalHost(s) free (%s) for %d new Machine(s): the rest wait until a host is "
                "freed (a lab has more with LAB_COMPUTE_HOSTS=N or LAB_SPARE_HOSTS=N, a pool lab with LAB_BARE_METAL=N)" % (
                    len(free), ", ".join(free) or "none", args.replicas - len(live)))

        def new_machines():
            return {n: m for n, m in machines(co, md, plural).items()
                    if n not in before and not m["metadata"].get("deletionTimestamp")}

        def provisioned():
            new = new_machines()
            ready = [n for n, m in new.items() if (m.get("status") or {}).get("phase") == "Provisioned"]
            return sorted(ready) if len(new) >= args.replicas - len(live) and len(ready) == len(new) else None
        new = wait(t0, "new Machines to be Provisioned", provisioned, args.timeout, explain=lambda: "; ".join(
            machine_state(co, m) for m in new_machines().values()) or "no new Machine")
        t_ready = time.time()
        log(t0, "Provisioned: %s" % ", ".join(new))
        if args.no_playbook:
            return 0
        if events_running(args.state) or args.wait_idle:
            who = "the event path" if events_running(args.state) else "their first boot"
            names = {hostname(m) for n, m in machines(co, md, plural).items() if n in new}
            wait(t0, "%s to join %s" % (who, ", ".join(sorted(names))),
                 lambda: names <= slurm_idle(args.state), args.timeout, poll=1 if who == "the event path" else 0.2)
            log(t0, "%s joined them: IDLE %.1f s after Provisioned, %.1f s after the scale (nobody ran a playbook)"
                % (who, time.time() - t_ready, time.time() - t0))
            return 0
        rc = playbook(repo, args.state, "scale_up.yml", args.extra_vars)
        log(t0, "scale_up.yml %s in %.1f s (from Provisioned to every new node IDLE)"
            % ("done" if rc == 0 else "FAILED, see %s/logs/scale_up.log" % args.state, time.time() - t_ready))
        return rc
    if args.replicas < len(live):
        def held():
            now = machines(co, md, plural)
            leaving = {n: m for n, m in now.items() if n in live and m["metadata"].get("deletionTimestamp")}
            waiting = [n for n, m in leaving.items() if (m.get("status") or {}).get("phase") == "Deleting"
                       or not any(k.startswith(HOOK_PREFIX) for k in m["metadata"].get("annotations") or {})]
            return sorted(leaving) if len(leaving) >= len(live) - args.replicas and len(waiting) == len(leaving) \
                else None
        leaving = wait(t0, "Machines to be picked for deletion", held, args.timeout)
        t_del = time.time()
        log(t0, "Deleting (held by the pre-terminate hook): %s" % ", ".join(leaving))
        if args.no_playbook:
            return 0
        if events_running(args.state):
            wait(t0, "the event path to release them", lambda: not (set(leaving) & set(machines(co, md, plural))),
                 args.timeout, poll=1)
            log(t0, "the event path drained and released them; Machines gone %.1f s after Deleting" % (
                time.time() - t_del))
            return 0
        rc = playbook(repo, args.state, "scale_down.yml", args.extra_vars)
        log(t0, "scale_down.yml %s in %.1f s" % ("done" if rc == 0 else "FAILED, see %s/logs/scale_down.log"
                                                 % args.state, time.time() - t_del))
        if rc != 0:
            return rc
        wait(t0, "the Machines to be gone", lambda: not (set(leaving) & set(machines(co, md, plural))), args.timeout)
        log(t0, "Machines gone, hosts deprovisioned: %s" % ", ".join(leaving))
        return 0
    log(t0, "nothing to do")
    return 0


if __name__ == "__main__":
    sys.exit(main())
