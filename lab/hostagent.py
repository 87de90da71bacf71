"""The lab's host agent: the hardware and the part of Ironic the lab plays, and nothing else.

The Bare Metal Operator (test mode) walks each BareMetalHost through its states; this agent watches them
and does to the lab's machines what a host's disk and power would see:
- a host provisioning for a consumer (CAPM3 claimed it for a Metal3Machine and set its image and user
  data): the lab machine of that host is booted anew (python3 lab/machines.py machine-boot) with the image
  of the node type its image URL names (http://images.lab.invalid/<node type>.qcow2, the
  Metal3MachineTemplate's; a ?build=<name> after it is an image build: lab/machines.py writes its name on the
  disk, and a build named *slurmd-fails* is an image whose slurmd never starts; a &suite=forky is the image of
  that Debian release) and the user data Secret CAPM3
  put on the host (cloud-init runs it at first boot), at the address the host's hardware details give (its
  first NIC's);
- a host deprovisioning, or available with a machine still on it: the machine is removed;
- a provisioned host powered off (spec.online false): the machine is stopped; on again: started;
- a host provisioning while another deprovisions is paused until that one is done: the operator's test
  provisioner keeps one image state for all hosts, and the two would undo each other for good.
- a host left in a state the operator moves on by itself, with no status saved for 30 s and not paused, is
  nudged (an annotation changed): its controller's requeue backoff may hold it for minutes (MOVING_STATES).
A machine that stopped by itself (killed, crashed) stays as it is: hardware does not come back by itself.

With --workload CLUSTER=KUBECONFIG (a Kubernetes workload cluster's API, lab/lab.sh's LAB_KUBERNETES_GPU) it
also plays the kubelet of that cluster's hosts, and only that: once a host claimed for one of the cluster's
Machines has booted, its Node is registered as a kubelet registers it (named after the host, labelled
metal3.io/uuid=<the host's uid> as Metal3's images label it, the providerID CAPM3 gives the Metal3Machine,
the host's CPUs, memory and nvidia.com/gpu count as capacity, Ready), so that Cluster API itself sets the
Machine's nodeRef and phase Running; a Pod bound to one of its Nodes is started (Running), and a Pod being
deleted there (an eviction in Cluster API's drain) is removed, as a kubelet does once its containers have
stopped. Cluster API deletes the Node when the Machine is gone.

Times are settings, as on real hardware (the reference hardware: 38.7 s provisioning, 145.2 s
deprovisioning). --provision-seconds: the machine boots so long after its host started provisioning (the
operator's test provisioner may already say provisioned: Ironic too reports a deploy done before the OS
has booted). --deprovision-seconds: a host given back cannot be claimed again until so long after its
machine was removed (the operator's paused annotation, which CAPM3 respects, while the test provisioner
is done within a second or a requeue: cleaning takes minutes on real hardware).

    python3 lab/hostagent.py --kubeconfig KUBECONFIG --namespace metal3 --state DIR [--workload CLUSTER=KUBECONFIG]
"""

import argparse
import base64
import calendar
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import kubeapi  # noqa: E402  pylint: disable=wrong-import-position

BMH = "metal3.io/v1alpha1"
PAUSED = "baremetalhost.metal3.io/paused"
PAUSED_BY = "converged-hpc-lab-hostagent"
RUNNING_STATES = ("provisioning", "provisioned")
GONE_STATES = ("deprovisioning", "available", "ready", "powering off before delete", "deleting")
# States the operator moves a host out of on its own. Its test provisioner finishes each step at once and the
# operator asks to be called again with no delay, which controller-runtime spaces out exponentially (5 ms
# doubling to 1000 s) until a result resets it; its controller ignores status-only updates. So a host that went
# through many quick steps may sit in one of these for up to 17 minutes (seen: 11.5 min in provisioning), where
# Ironic's steps would have brought it back with their delays. A change to its annotations brings it back.
MOVING_STATES = ("registering", "inspecting", "preparing", "provisioning", "deprovisioning",
                 "powering off before delete", "deleting")
STALL_SECONDS = 30.0
NUDGED = "lab.converged-hpc/nudged-at"


def say(message):
    print("[hostagent %s] %s" % (time.strftime("%H:%M:%S"), message), flush=True)


def node_type_of(image_url):
    base = (image_url or "").rstrip("/").rpartition("/")[2]
    return base.split(".")[0] if base else None


def suite_of(image_url):
    """The Debian suite a URL names (http://images.lab.invalid/compute.qcow2?suite=forky: forky), or ""."""
    query = (image_url or "").partition("?")[2]
    pairs = [pair.partition("=") for pair in query.split("&")]
    return next((pair[2] for pair in pairs if pair[0] == "suite"), "")


def build_of(image_url):
    """The image build a URL names (http://images.lab.invalid/compute.qcow2?build=v2: v2), or ""."""
    query = (image_url or "").partition("?")[2]
    pairs = (part.partition("=") for part in query.split("&"))
    return next((pair[2] for pair in pairs if pair[0] == "build"), "")


def address_of(host):
    nics = (((host.get("status") or {}).get("hardware") or {}).get("nics")) or []
    return next((nic["ip"] for nic in nics if nic.get("ip")), None)


INFRA = "infrastructure.cluster.x-k8s.io/v1beta2"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
UUID_LABEL = "metal3.io/uuid"


class Kubelet:
    """The kubelets of one workload cluster's hosts (its API: a kubeapi.Api)."""

    def __init__(self, api):
        self.api = api

    def register(self, host, metal3machine):
        """The host's Node as its kubelet registers it; a Node of the same name left from an earlier claim
        (another providerID, which a Node never changes) is replaced."""
        meta, hardware = host["metadata"], ((host.get("status") or {}).get("hardware") or {})
        name = hardware.get("hostname") or meta["name"]
        provider_id = "metal3://%s/%s/%s" % (meta["namespace"], meta["name"], metal3machine)
        current = self.api.get("v1", "nodes", None, name)
        if current is not None and (current.get("spec") or {}).get("providerID") != provider_id:
            self.api.request("DELETE", "/api/v1/nodes/" + name)
            current = None
        if current is None:
            labels = {"kubernetes.io/hostname": name, UUID_LABEL: meta["uid"], "kubernetes.io/os": "linux"}
            current = self.api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                                       "spec": {"providerID": provider_id}})
        capacity = {"cpu": str((hardware.get("cpu") or {}).get("count", 1)),
                    "memory": "%dMi" % hardware.get("ramMebibytes", 1024), "pods": "110"}
        gpus = (meta.get("labels") or {}).get("nvidia.com/gpu.count")
        if gpus:
            capacity["nvidia.com/gpu"] = gpus
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        address = address_of(host)
        current["status"] = {
            "capacity": capacity, "allocatable": dict(capacity),
            "addresses": ([{"type": "InternalIP", "address": address}] if address else [])
            + [{"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}]}
        self.api.ok("PUT", "/api/v1/nodes/%s/status" % name, current)
        return name

    def tick(self):
        """Start the Pods bound to a Node, remove those being deleted (their containers stopped at once)."""
        nodes = {n["metadata"]["name"] for n in self.api.list("v1", "nodes")}
        for pod in self.api.list("v1", "pods"):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if spec.get("nodeName") not in nodes:
                continue
            path = "/api/v1/namespaces/%s/pods/%s" % (meta["namespace"], meta["name"])
            if meta.get("deletionTimestamp"):
                self.api.request("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                                 query={"gracePeriodSeconds": "0"})
                say("pod %s/%s on %s removed (deleted: its containers stopped)" % (
                    meta["namespace"], meta["name"], spec["nodeName"]))
            elif (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                status = {"phase": "Running", "startTime": now, "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": now}]}
                self.api.ok("PATCH", path + "/status", {"status": status}, "application/merge-patch+json")
                say("pod %s/%s started on %s" % (meta["namespace"], meta["name"], spec["nodeName"]))


class Agent:
    def __init__(self, api, namespace, state, machines_cmd, provision_seconds=0.0, deprovision_seconds=0.0,
                 workloads=None):
        self.api, self.ns, self.state = api, namespace, state
        self.kubelets = {cluster: Kubelet(wapi) for cluster, wapi in (workloads or {}).items()}
        self.registered = {}  # host -> what its Node was registered for ("consumer image")
        self.machines = shlex.split(machines_cmd)
        self.hold = {"provisioning": provision_seconds, "deprovisioning": deprovision_seconds}
        self.record_path = os.path.join(state, "hostagent.json")
        try:
            with open(self.record_path) as fh:
                self.booted = json.load(fh)  # host -> what it was booted for ("consumer image")
        except (OSError, ValueError):
            self.booted = {}
        self.stopped_by_us = set()
        self.absent = set()  # hosts given back with no machine on them, looked at once
        self.busy = set()
        self.released = {}  # host -> when its machine was removed
        self.retry = {}  # host -> (when a failed boot may be tried again, the wait before that)
        self.moving = []  # the hosts the last look found in a state the operator moves on from
        self.lock = threading.Lock()
        self.unreachable_since = None
        self.nudged = {}  # host -> when it was last nudged (monotonic)

    def nudge(self, host, state):
        """A host in a MOVING_STATE its operator has not saved for STALL_SECONDS: an annotation changed on it, so
        that the operator reconciles it now (at most once per STALL_SECONDS). Not a paused host (ours or
        anyone's): pausing stops the operator on purpose."""
        meta = host["metadata"]
        name = meta["name"]
        if state not in MOVING_STATES or PAUSED in (meta.get("annotations") or {}):
            self.nudged.pop(name, None)
            return
        try:
            saved = calendar.timegm(time.strptime(host["status"]["lastUpdated"], "%Y-%m-%dT%H:%M:%SZ"))
        except (KeyError, TypeError, ValueError):
            return
        still = time.time() - saved
        if still < STALL_SECONDS or time.monotonic() - self.nudged.get(name, -STALL_SECONDS) < STALL_SECONDS:
            return
        self.api.patch(BMH, "baremetalhosts", self.ns, name,
                       {"metadata": {"annotations": {NUDGED: str(int(time.time()))}}})
        self.nudged[name] = time.monotonic()
        say("%s %s for %.0f s, not saved by the operator since: nudged (an annotation changed)" % (name, state, still))

    def save(self):
        with open(self.record_path + ".new", "w") as fh:
            json.dump(self.booted, fh)
        os.replace(self.record_path + ".new", self.record_path)

    # ---- what a host's hardware does
    def user_data(self, host):
        ref = (host.get("spec") or {}).get("userData") or {}
        if not ref.get("name"):
            return None
        secret = self.api.get("v1", "secrets", ref.get("namespace") or self.ns, ref["name"])
        value = ((secret or {}).get("data") or {}).get("value")
        return base64.b64decode(value) if value else None

    def boot(self, name, key, host):
        t0 = time.monotonic()
        try:
            time.sleep(self.hold["provisioning"])
            node_type, address = node_type_of(host["spec"]["image"]["url"]), address_of(host)
            if not node_type or not address:
                raise RuntimeError("host %s: no node type in its image URL (%s) or no address in its hardware"
                                   % (name, host["spec"]["image"].get("url")))
            data = self.user_data(host)
            with tempfile.NamedTemporaryFile(prefix="userdata-", dir=self.state) as fh:
                args = self.machines + ["machine-boot", name, address, node_type]
                if data is not None:
                    fh.write(data)
                    fh.flush()
                    args.append(fh.name)
                url = host["spec"]["image"]["url"]
                env = dict(os.environ, LAB_IMAGE_BUILD=build_of(url))
                if suite_of(url):  # an image of another Debian release (another Slurm)
                    env["LAB_SUITE"] = suite_of(url)
                proc = subprocess.run(args, capture_output=True, text=True, check=False, env=env)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip()[-800:])
            with self.lock:
                self.booted[name] = key
                self.absent.discard(name)
                self.retry.pop(name, None)
                self.save()
            say("%s booted as %s at %s for %s in %.1f s%s" % (
                name, node_type, address, host["spec"]["consumerRef"]["name"], time.monotonic() - t0,
                " (with its user data)" if data is not None else ""))
        except Exception as exc:  # pylint: disable=broad-except
            with self.lock:  # tried again later: 5 s, then twice as long each time, a minute at most
                wait = min(60.0, 2 * self.retry.get(name, (0, 2.5))[1])
                self.retry[name] = (time.monotonic() + wait, wait)
            say("ERROR: booting %s failed (again in %.0f s): %s" % (name, wait, exc))
        finally:
            with self.lock:
                self.busy.discard(name)

    def remove(self, name, why):
        try:
            subprocess.run(self.machines + ["machine-remove", name], capture_output=True, text=True, check=True)
            with self.lock:
                if self.hold["deprovisioning"]:
                    self.released[name] = time.monotonic()
                self.booted.pop(name, None)
                self.stopped_by_us.discard(name)
                self.save()
            say("%s removed (%s)" % (name, why))
        except subprocess.CalledProcessError as exc:
            say("ERROR: removing %s failed: %s" % (name, exc.stderr.strip()[-500:]))
        finally:
            with self.lock:
                self.busy.discard(name)

    @staticmethod
    def container_states():
        """Every container's state by name ("running", "exited", ...), in one podman call: {} when it fails.
        (A `podman inspect` a host each second cost a lab of eight hosts about a third of a CPU.)"""
        proc = subprocess.run(["podman", "ps", "-a", "--format", "json"], capture_output=True, text=True,
                              check=False)
        try:
            listed = json.loads(proc.stdout or "[]") if proc.returncode == 0 else []
        except ValueError:
            listed = []
        return {name: entry.get("State") for entry in listed or [] for name in entry.get("Names") or []}

    def power(self, name, online, state_of):
        """A booted host's power: its machine stopped when the host is powered off, started when powered on
        again after we stopped it. Looks at the machine only when one of those may be due."""
        if online != (name in self.stopped_by_us):
            return  # on and not stopped by us (running, or stopped by itself: it stays), or off and stopped
        state = state_of(name)
        if not online and state == "running":
            subprocess.run(["podman", "stop", "-t", "5", name], capture_output=True, check=False)
            self.stopped_by_us.add(name)
            say("%s powered off" % name)
        elif online and name in self.stopped_by_us and state in ("exited", "stopped", "created"):
            subprocess.run(["podman", "start", name], capture_output=True, check=False)
            self.stopped_by_us.discard(name)
            say("%s powered on" % name)

    def join_workload(self, host, key):
        """A booted host of a workload cluster's Machine: its kubelet registers the Node (once per claim)."""
        name, consumer = host["metadata"]["name"], host["spec"]["consumerRef"]
        m3m = self.api.get(INFRA, "metal3machines", consumer.get("namespace") or self.ns, consumer["name"])
        kubelet = self.kubelets.get(((m3m or {}).get("metadata", {}).get("labels") or {}).get(CLUSTER_LABEL))
        if kubelet is not None:
            node = kubelet.register(host, consumer["name"])
            say("%s: node %s registered in the workload cluster (Ready)" % (name, node))
        self.registered[name] = key

    # ---- the Ironic pace
    def pace(self, host, state, deprovisioning):
        """Keep a host given back paused (unclaimable) until --deprovision-seconds after its machine went; and
        a host provisioning paused while another deprovisions: the operator's test provisioner keeps one
        image state for all its hosts, which a provisioning sets and a deprovisioning clears, each undoing
        the other's at every requeue (both stuck for good). A deprovisioning clears only: it goes first."""
        meta = host["metadata"]
        name = meta["name"]
        released = self.released.get(name)
        paused = (meta.get("annotations") or {}).get(PAUSED) == PAUSED_BY
        held = released is not None and time.monotonic() - released < self.hold["deprovisioning"]
        if released is not None and not held:
            self.released.pop(name, None)
        want = held or (state == "provisioning" and bool(deprovisioning))
        if want != paused:
            self.api.patch(BMH, "baremetalhosts", self.ns, name,
                           {"metadata": {"annotations": {PAUSED: PAUSED_BY if want else None}}})

    # ---- one look at every host
    def tick(self):
        hosts = self.api.list(BMH, "baremetalhosts", self.ns)
        seen = {}

        def state_of(name):  # the machines' states, listed at most once a tick and only when a host asks
            if "states" not in seen:
                seen["states"] = self.container_states()
            return seen["states"].get(name)
        deprovisioning = [h["metadata"]["name"] for h in hosts
                          if ((h.get("status") or {}).get("provisioning") or {}).get("state") == "deprovisioning"]
        self.moving = [h["metadata"]["name"] for h in hosts
                       if ((h.get("status") or {}).get("provisioning") or {}).get("state") in MOVING_STATES]
        for host in hosts:
            name, spec = host["metadata"]["name"], host.get("spec") or {}
            state = ((host.get("status") or {}).get("provisioning") or {}).get("state")
            consumer = (spec.get("consumerRef") or {}).get("name")
            image = (spec.get("image") or {}).get("url")
            if name in self.released or state == "provisioning" \
                    or (host["metadata"].get("annotations") or {}).get(PAUSED) == PAUSED_BY:
                self.pace(host, state, deprovisioning)
            self.nudge(host, state)
            with self.lock:
                if name in self.busy:
                    continue
                if state in RUNNING_STATES and consumer and image:
                    key = "%s %s" % (consumer, image)
                    if self.booted.get(name) != key:
                        if time.monotonic() < self.retry.get(name, (0, 0))[0]:
                            continue
                        self.busy.add(name)
                        threading.Thread(target=self.boot, args=(name, key, host), daemon=True).start()
                        continue
                    booted = True
                else:
                    booted = False
                    self.retry.pop(name, None)  # a later claim boots at once
                known = name in self.booted
            if booted:
                self.power(name, bool(spec.get("online")), state_of)
                if self.kubelets and self.registered.get(name) != key:
                    self.join_workload(host, key)
            elif state in GONE_STATES and not known and name not in self.absent and state_of(name) is None:
                self.absent.add(name)  # no machine there (none booted by an earlier agent): not looked at again
            elif state in GONE_STATES and (known or name not in self.absent):
                with self.lock:
                    self.busy.add(name)
                self.registered.pop(name, None)
                threading.Thread(target=self.remove, args=(name, "host %s" % state), daemon=True).start()
        for kubelet in self.kubelets.values():
            kubelet.tick()

    def active(self):
        """Whether something is under way that a look every second serves: a machine booting or going, a host
        held or retried, a host in a state the operator moves on from (the last look's)."""
        with self.lock:
            return bool(self.busy or self.released or self.retry or self.moving)

    def run(self, stopped, interval=1.0, idle=3.0):
        """A look at every host after each change a watch reports, every interval seconds while something is
        under way, and every idle seconds else (a resync: the watch may miss nothing, but costs nothing either)."""
        say("watching BareMetalHosts in %s (machines boot %ss after provisioning starts, hosts claimable %ss "
            "after their machine is removed)"
            % (self.ns, self.hold["provisioning"], self.hold["deprovisioning"]))
        changes = Changes(self.api, self.ns)
        changes.start()
        while not stopped:
            try:
                self.tick()
                if self.unreachable_since is not None:
                    say("the management cluster answers again")
                self.unreachable_since = None
            except (OSError, kubeapi.ApiError) as exc:
                if self.unreachable_since is None:
                    self.unreachable_since = time.monotonic()
                    say("the management cluster does not answer (%s): retrying" % exc)
            except Exception:  # pylint: disable=broad-except
                say("ERROR (the agent goes on):\n" + traceback.format_exc())
            changes.changed.wait(interval if self.active() or self.unreachable_since is not None else idle)
            changes.changed.clear()


class Changes(threading.Thread):
    """Wakes the agent when a BareMetalHost changes: a list for the resourceVersion, then a watch from it (etcd
    3.4 refuses a watch without one), asked again each time it ends. An idle lab's agent then looks every few
    seconds instead of every second, and at once when the operator or CAPM3 changes a host."""

    def __init__(self, api, namespace):
        super().__init__(daemon=True)
        self.api, self.ns, self.changed = api, namespace, threading.Event()

    def run(self):
        path = self.api.path(BMH, "baremetalhosts", self.ns)
        while True:
            try:
                version = self.api.ok("GET", path, query={"limit": "1"})["metadata"]["resourceVersion"]
                query = urllib.parse.urlencode({"watch": "1", "resourceVersion": version, "timeoutSeconds": "60"})
                headers = {"Authorization": "Bearer " + self.api.token} if self.api.token else {}
                req = urllib.request.Request(self.api.url + path + "?" + query, headers=headers)
                with urllib.request.urlopen(req, context=self.api.context, timeout=90) as resp:
                    for line in resp:
                        if line.strip():
                            self.changed.set()
            except Exception:  # pylint: disable=broad-except
                time.sleep(2)  # the server away: the agent's own looks go on meanwhile
            self.changed.set()  # a watch ended: one look, in case it missed what happened in between


def main(argv=None):
    ap = argparse.ArgumentParser(prog="lab/hostagent.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--namespace", default="metal3")
    ap.add_argument("--state", required=True, help="where the agent keeps what it booted")
    ap.add_argument("--machines", default="python3 %s" % os.path.join(REPO, "lab", "machines.py"),
                    help="the command that boots and removes lab machines")
    ap.add_argument("--provision-seconds", type=float, default=0.0)
    ap.add_argument("--deprovision-seconds", type=float, default=0.0)
    ap.add_argument("--pid-file")
    ap.add_argument("--workload", action="append", default=[], metavar="CLUSTER=KUBECONFIG",
                    help="play the kubelet of this Cluster's hosts in its Kubernetes API")
    args = ap.parse_args(argv)
    os.makedirs(args.state, exist_ok=True)
    if args.pid_file:
        with open(args.pid_file, "w") as fh:
            fh.write(str(os.getpid()))
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopped.append(True))
    workloads = {cluster: kubeapi.api_from_kubeconfig(path)
                 for cluster, path in (w.split("=", 1) for w in args.workload)}
    Agent(kubeapi.api_from_kubeconfig(args.kubeconfig), args.namespace, args.state, args.machines,
          args.provision_seconds, args.deprovision_seconds, workloads).run(stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
