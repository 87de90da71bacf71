"""A small stand-in for Cluster API's MachineDeployment, MachinePool and Machine controllers.

It does, for the lab and the tests, what CAPI does for the parts this project
depends on:

* MachineDeployment replicas up: create Machines (labels and annotations from
  the template, finalizer machine.cluster.x-k8s.io, phase Provisioning) with a
  Metal3Machine and a BareMetalHost; once the provisioner has booted the host,
  the Machine becomes Provisioned with its addresses (a Slurm host never gets a
  Kubernetes Node, so never Running).
* replicas down: pick Machines - those annotated cluster.x-k8s.io/delete-machine
  first, then by spec.deletion.order (Random, Newest, Oldest) - and delete them
  (deletionTimestamp; the finalizer keeps them).
* MachinePool replicas, as with an infrastructure provider that supports MachinePool
  Machines: the same, with Machines labelled cluster.x-k8s.io/pool-name and owned
  (ownerReferences, controller) by the MachinePool; delete-machine first, then the
  newest. Metal3 itself has no MachinePool implementation: the pool's Machines get a
  Metal3Machine and a BareMetalHost here only so that the lab's hosts look alike.
* a deleting Machine waits while hooks remain, exactly as CAPI's reconcileDelete:
  pre-drain.delete.hook... only when the Machine has status.nodeRef, then
  pre-terminate.delete.hook... always. Then the host is released (provisioner),
  the Metal3 objects are deleted and the finalizer removed: the Machine is gone.
* with a pool of BareMetalHosts (a template naming a Metal3MachineTemplate the store holds):
  Metal3's association, host states and deprovisioning, in metal3.py.
* a Machine of a cluster whose workload API is given (workloads, workload.py): its Node registered
  there once the host has booted, status.nodeRef and phase Running; on deletion, after the pre-drain
  hooks, the Node drained (cordon, every Pod evicted), then the pre-terminate hooks, the host released,
  and the Node deleted, as CAPI's reconcileDelete orders them.
"""

import base64
import copy
import random
import threading
import time
import uuid

from .metal3 import Metal3Pool
from .store import ApiError, now

CAPI = "cluster.x-k8s.io"
INFRA = "infrastructure.cluster.x-k8s.io"
FINALIZER = "machine.cluster.x-k8s.io"
PRE_DRAIN = "pre-drain.delete.hook.machine.cluster.x-k8s.io"
PRE_TERMINATE = "pre-terminate.delete.hook.machine.cluster.x-k8s.io"
DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
POOL_LABEL = "cluster.x-k8s.io/pool-name"
# what owns Machines: (plural, kind, the label naming the owner on its Machines)
OWNERS = (("machinedeployments", "MachineDeployment", DEPLOYMENT_LABEL), ("machinepools", "MachinePool", POOL_LABEL))


class Provisioner:
    """What boots and releases hosts. The lab's runs lab/machines.py; tests use fakes."""

    def provision(self, machine_name, node_type, user_data=None):
        """Boot a host for the Machine; return (hostname, address, cpus, ram_mib). user_data: the
        Machine's bootstrap data (bytes, the `value` of its bootstrap.dataSecretName Secret) or None."""
        raise NotImplementedError

    def release(self, hostname):
        """Power the host off / remove it."""
        raise NotImplementedError

    def provision_host(self, host, address, machine_name, node_type, user_data=None):
        """Boot a pool's registered host (a BareMetalHost's name and address) with the image of the
        Machine's node type; return (hostname, address, cpus, ram_mib)."""
        raise NotImplementedError


def hooks(meta, prefix):
    return sorted(k for k in (meta.get("annotations") or {}) if k.startswith(prefix + "/"))


class CapiController:
    def __init__(self, store, provisioner, interval=0.3, seed=None, deprovision_seconds=0.0, workloads=None):
        self.store = store
        self.workloads = dict(workloads or {})  # cluster name -> workload.WorkloadCluster
        self.drained = set()  # Machines whose Node was drained
        self.provisioner = provisioner
        self.interval = interval
        self.random = random.Random(seed)
        self.busy = set()  # machine names with a provisioning/release in flight
        self.events = []  # (time, machine, what) for tests and benchmarks
        self._stop = threading.Event()
        self._thread = None
        self.errors = []
        self.metal3 = Metal3Pool(self, deprovision_seconds)

    # ------------------------------------------------------------------ helpers
    def res(self, group, plural):
        return self.store.resource(group, plural)

    def _items(self, group, plural):
        with self.store.lock:
            return list(self.store.objects[(group, plural)].values())

    def _status(self, res, obj, status):
        """Merge into the object's status (as a controller's status patch)."""
        meta = obj["metadata"]
        with self.store.lock:
            current = self.store.get(res, meta.get("namespace"), meta["name"])
            body = copy.deepcopy(current)
            merged = dict(body.get("status") or {})
            merged.update(status)
            body["status"] = merged
            return self.store.update(res, meta.get("namespace"), meta["name"], body, subresource="status",
                                     precondition_rv=current["metadata"]["resourceVersion"])

    def note(self, machine, what):
        self.events.append((time.time(), machine, what))

    # ------------------------------------------------------------------ loop
    def start(self):
        self._thread = threading.Thread(target=self._run, name="capi-controller", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.reconcile()
            except ApiError as err:  # a conflict with a client's write: try again next round
                if err.code != 409:
                    self.errors.append(str(err))
            except Exception as exc:  # keep the controller alive, as a real one would
                self.errors.append(repr(exc))
            with self.store.lock:
                self.store.changed.wait(self.interval)

    def reconcile(self):
        for plural, dummy, label in OWNERS:
            for owner in self._items(CAPI, plural):
                self._reconcile_owner(owner, plural, label)
        self.metal3.reconcile()
        for machine in self._items(CAPI, "machines"):
            if machine["metadata"].get("deletionTimestamp"):
                self._reconcile_delete(machine)

    # ------------------------------------------------------------------ scale
    def _machines_of(self, owner, label=DEPLOYMENT_LABEL):
        ns, name = owner["metadata"].get("namespace"), owner["metadata"]["name"]
        return [m for m in self._items(CAPI, "machines")
                if m["metadata"].get("namespace") == ns
                and (m["metadata"].get("labels") or {}).get(label) == name]

    def _reconcile_owner(self, owner, plural, label):
        """A MachineDeployment's or MachinePool's replicas: create or delete Machines, then status."""
        spec = owner.get("spec") or {}
        wanted = int(spec.get("replicas", 0))
        machines = self._machines_of(owner, label)
        live = [m for m in machines if not m["metadata"].get("deletionTimestamp")]
        if len(live) < wanted:
            for dummy in range(wanted - len(live)):
                self._create_machine(owner, label)
        elif len(live) > wanted:
            for victim in self._pick_victims(owner, live, len(live) - wanted, label):
                self.store.delete(self.res(CAPI, "machines"), victim["metadata"]["namespace"],
                                  victim["metadata"]["name"])
                self.note(victim["metadata"]["name"], "deletion requested")
        machines = self._machines_of(owner, label)
        ready = [m for m in machines if not m["metadata"].get("deletionTimestamp")
                 and (m.get("status") or {}).get("phase") in ("Provisioned", "Running")]
        status = owner.get("status") or {}
        if status.get("replicas") != len(machines) or status.get("readyReplicas") != len(ready):
            self._status(self.res(CAPI, plural), owner, {"replicas": len(machines), "readyReplicas": len(ready)})

    def _pick_victims(self, owner, live, count, label=DEPLOYMENT_LABEL):
        marked = [m for m in live if DELETE_MACHINE in (m["metadata"].get("annotations") or {})]
        rest = [m for m in live if m not in marked]
        if label == POOL_LABEL:
            order = "Newest"
        else:
            order = ((owner.get("spec") or {}).get("deletion") or {}).get("order") or "Random"
        if order == "Newest":
            rest.sort(key=lambda m: (m["metadata"].get("creationTimestamp", ""), m["metadata"]["name"]),
                      reverse=True)
        elif order == "Oldest":
            rest.sort(key=lambda m: (m["metadata"].get("creationTimestamp", ""), m["metadata"]["name"]))
        else:
            self.random.shuffle(rest)
        return (marked + rest)[:count]

    def _create_machine(self, owner, label=DEPLOYMENT_LABEL):
        spec = owner["spec"]
        template = spec.get("template") or {}
        tmeta = template.get("metadata") or {}
        ns = owner["metadata"].get("namespace")
        cluster = spec.get("clusterName")
        name = "%s-%s" % (owner["metadata"]["name"], uuid.uuid4().hex[:5])
        labels = dict(tmeta.get("labels") or {})
        labels.update({label: owner["metadata"]["name"], "cluster.x-k8s.io/cluster-name": cluster})
        tspec = copy.deepcopy(template.get("spec") or {})
        tspec["infrastructureRef"] = {"apiGroup": INFRA, "kind": "Metal3Machine", "name": name}
        bootstrap = tspec.setdefault("bootstrap", {})
        if not bootstrap.get("dataSecretName"):  # else a bootstrap provider's Secret, one per Machine
            bootstrap["dataSecretName"] = name
        tspec["clusterName"] = cluster
        machine = {"apiVersion": CAPI + "/v1beta2", "kind": "Machine",
                   "metadata": {"name": name, "namespace": ns, "labels": labels,
                                "annotations": dict(tmeta.get("annotations") or {}), "finalizers": [FINALIZER]},
                   "spec": tspec}
        if label == POOL_LABEL:  # a MachinePool Machine: owned by its pool
            machine["metadata"]["ownerReferences"] = [{
                "apiVersion": CAPI + "/v1beta2", "kind": "MachinePool", "name": owner["metadata"]["name"],
                "uid": owner["metadata"].get("uid", ""), "controller": True, "blockOwnerDeletion": True}]
        template = self.metal3.template_of(owner)
        if template is not None:  # a pool's host: claimed by the Metal3 loop, booted once claimed
            created = self.store.create(self.res(CAPI, "machines"), ns, machine)
            self._status(self.res(CAPI, "machines"), created, {"phase": "Provisioning"})
            self.store.create(self.res(INFRA, "metal3machines"), ns, self.metal3.metal3machine_for(template, created))
            self.note(name, "created")
            return
        created = self.store.create(self.res(CAPI, "machines"), ns, machine)
        self._status(self.res(CAPI, "machines"), created, {"phase": "Provisioning"})
        self.store.create(self.res(INFRA, "metal3machines"), ns, {
            "apiVersion": INFRA + "/v1beta2", "kind": "Metal3Machine",
            "metadata": {"name": name, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
            "spec": {}})
        self.note(name, "created")
        node_type = labels.get("node-type", "")
        self.busy.add(name)
        threading.Thread(target=self._provision, args=(ns, name, node_type), daemon=True).start()

    def _bootstrap_data(self, ns, name):
        """The Machine's bootstrap data: the `value` of the Secret its bootstrap.dataSecretName names
        (as Metal3 passes it to the host as user data), or None when there is no such Secret."""
        with self.store.lock:
            try:
                machine = self.store.get(self.res(CAPI, "machines"), ns, name)
                secret_name = ((machine.get("spec") or {}).get("bootstrap") or {}).get("dataSecretName")
                secret = self.store.get(self.res("", "secrets"), ns, secret_name) if secret_name else None
            except ApiError:
                return None
        value = ((secret or {}).get("data") or {}).get("value")
        return base64.b64decode(value) if value else None

    def _provision(self, ns, name, node_type):
        try:
            hostname, address, cpus, ram = self.provisioner.provision(name, node_type, self._bootstrap_data(ns, name))
        except Exception as exc:
            self.errors.append("provisioning %s failed: %s" % (name, exc))
            self._set_machine_phase(ns, name, "Failed")
            self.busy.discard(name)
            return
        self.finish_provisioned(ns, name, hostname, hostname, address, cpus, ram)
        self.busy.discard(name)

    def finish_provisioned(self, ns, name, host, hostname, address, cpus, ram, pool=False):
        """The host booted: its BareMetalHost provisioned, the Metal3Machine and the Machine with its
        providerID and addresses, the Machine Provisioned. Without a pool the BareMetalHost is made here."""
        provider_id = "metal3://%s/%s/%s" % (ns, host, name)
        addresses = [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": hostname}]
        bmh_res = self.res("metal3.io", "baremetalhosts")
        if pool:
            with self.store.lock:
                bmh = self.store.get(bmh_res, ns, host)
                provisioning = dict((bmh.get("status") or {}).get("provisioning") or {}, state="provisioned")
                if (bmh.get("spec") or {}).get("image"):
                    provisioning["image"] = bmh["spec"]["image"]
                self._status(bmh_res, bmh, {"provisioning": provisioning, "poweredOn": True,
                                            "operationalStatus": "OK"})
        else:
            self._legacy_host(ns, name, hostname, address, cpus, ram)
        with self.store.lock:
            m3m_res = self.res(INFRA, "metal3machines")
            m3m = copy.deepcopy(self.store.get(m3m_res, ns, name))
            m3m["metadata"].setdefault("annotations", {})["metal3.io/BareMetalHost"] = "%s/%s" % (ns, host)
            m3m["spec"]["providerID"] = provider_id
            m3m = self.store.update(m3m_res, ns, name, m3m)
            self._status(m3m_res, m3m, {"addresses": addresses, "ready": True} if not pool else
                         {"addresses": addresses, "initialization": {"provisioned": True}})
            machine_res = self.res(CAPI, "machines")
            machine = copy.deepcopy(self.store.get(machine_res, ns, name))
            machine["spec"]["providerID"] = provider_id
            machine = self.store.update(machine_res, ns, name, machine)
            self._status(machine_res, machine, {"phase": "Provisioned", "addresses": addresses})
        self.note(name, "provisioned")
        workload = self.workloads.get(machine["spec"].get("clusterName"))
        if workload is not None:
            self._join_workload(workload, ns, name, host, hostname, cpus, ram)

    def _join_workload(self, workload, ns, name, host, hostname, cpus, ram):
        """The host's kubelet registers its Node; Cluster API then sets nodeRef, phase Running."""
        machine_res = self.res(CAPI, "machines")
        machine = self.store.get(machine_res, ns, name)
        extended = {}
        try:
            bmh = self.store.get(self.res("metal3.io", "baremetalhosts"), ns, host)
            gpus = (bmh["metadata"].get("labels") or {}).get("nvidia.com/gpu.count")
            if gpus:
                extended["nvidia.com/gpu"] = gpus
        except ApiError:
            pass
        labels = {"kubernetes.io/hostname": hostname,
                  "node-type": (machine["metadata"].get("labels") or {}).get("node-type", "")}
        workload.register_node(hostname, labels, cpus, ram, extended)
        with self.store.lock:
            self._status(machine_res, self.store.get(machine_res, ns, name),
                         {"phase": "Running", "nodeRef": {"name": hostname}})
        self.note(name, "node %s registered" % hostname)

    def _legacy_host(self, ns, name, hostname, address, cpus, ram):
        """A BareMetalHost made for the Machine (no pool), provisioned."""
        bmh_res = self.res("metal3.io", "baremetalhosts")
        node_type = ((self.store.get(self.res(CAPI, "machines"), ns, name)["metadata"].get("labels") or {})
                     .get("node-type", ""))
        try:
            self.store.create(bmh_res, ns, {
                "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
                "metadata": {"name": hostname, "namespace": ns, "labels": {"node-type": node_type}},
                "spec": {"online": True, "consumerRef": {"kind": "Metal3Machine", "name": name}}})
        except ApiError as err:
            if err.code != 409:
                raise
        with self.store.lock:
            bmh = self.store.get(bmh_res, ns, hostname)
            self._status(bmh_res, bmh, {"provisioning": {"state": "provisioned"}, "operationalStatus": "OK",
                                        "hardware": {"cpu": {"count": cpus}, "ramMebibytes": ram,
                                                     "hostname": hostname,
                                                     "nics": [{"name": "eth0", "ip": address}]}})

    def _set_machine_phase(self, ns, name, phase):
        res = self.res(CAPI, "machines")
        with self.store.lock:
            try:
                self._status(res, self.store.get(res, ns, name), {"phase": phase})
            except ApiError:
                pass

    # ------------------------------------------------------------------ delete
    def _reconcile_delete(self, machine):
        meta = machine["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        if FINALIZER not in (meta.get("finalizers") or []) or name in self.busy:
            return
        status = machine.get("status") or {}
        res = self.res(CAPI, "machines")
        if status.get("nodeRef") and hooks(meta, PRE_DRAIN):
            if status.get("phase") != "Deleting" or "waitForPreDrainHookStartTime" not in (status.get("deletion") or {}):
                self._status(res, machine, {"phase": "Deleting",
                                            "deletion": dict(status.get("deletion") or {},
                                                             waitForPreDrainHookStartTime=now())})
                self.note(name, "waiting for pre-drain hook")
            return
        workload = self.workloads.get((machine.get("spec") or {}).get("clusterName"))
        if status.get("nodeRef") and workload is not None and name not in self.drained:
            if "nodeDrainStartTime" not in (status.get("deletion") or {}):
                self._status(res, machine, {"phase": "Deleting",
                                            "deletion": dict(status.get("deletion") or {}, nodeDrainStartTime=now())})
            self.busy.add(name)
            threading.Thread(target=self._drain, args=(workload, name, status["nodeRef"]["name"]),
                             daemon=True).start()
            return
        if hooks(meta, PRE_TERMINATE):
            if status.get("phase") != "Deleting" or \
                    "waitForPreTerminateHookStartTime" not in (status.get("deletion") or {}):
                self._status(res, machine, {"phase": "Deleting",
                                            "deletion": dict(status.get("deletion") or {},
                                                             waitForPreTerminateHookStartTime=now())})
                self.note(name, "waiting for pre-terminate hook")
            return
        self.busy.add(name)
        self.note(name, "hooks released")
        threading.Thread(target=self._finish_delete, args=(ns, name), daemon=True).start()

    def _drain(self, workload, name, node):
        try:
            evicted = workload.drain(node)
            self.drained.add(name)
            self.note(name, "node %s drained (%d Pod(s) evicted)" % (node, len(evicted)))
        except Exception as exc:  # the next round tries again
            self.errors.append("draining node %s of %s failed: %s" % (node, name, exc))
        finally:
            self.busy.discard(name)

    def _finish_delete(self, ns, name):
        try:
            m3m_res = self.res(INFRA, "metal3machines")
            bmh_ref = None
            with self.store.lock:
                try:
                    m3m = self.store.get(m3m_res, ns, name)
                    bmh_ref = (m3m["metadata"].get("annotations") or {}).get("metal3.io/BareMetalHost")
                except ApiError:
                    m3m = None
            if m3m is not None and self.metal3.is_pool_machine(m3m):
                self.metal3.release(ns, name, m3m)  # the host stays, deprovisioned, then available
            elif bmh_ref:
                hostname = bmh_ref.split("/", 1)[-1]
                self.provisioner.release(hostname)
                try:
                    self.store.delete(self.res("metal3.io", "baremetalhosts"), ns, hostname)
                except ApiError:
                    pass
            if m3m is not None:
                try:
                    self.store.delete(m3m_res, ns, name)
                except ApiError:
                    pass
            res = self.res(CAPI, "machines")
            machine = self.store.get(res, ns, name)
            workload = self.workloads.get((machine.get("spec") or {}).get("clusterName"))
            node = ((machine.get("status") or {}).get("nodeRef") or {}).get("name")
            if workload is not None and node:
                workload.delete_node(node)
                self.note(name, "node %s deleted" % node)
            with self.store.lock:
                machine = copy.deepcopy(self.store.get(res, ns, name))
                machine["metadata"]["finalizers"] = [f for f in machine["metadata"].get("finalizers") or []
                                                     if f != FINALIZER]
                self.store.update(res, ns, name, machine)
            self.note(name, "deleted")
        except Exception as exc:
            self.errors.append("deleting %s failed: %s" % (name, exc))
        finally:
            self.busy.discard(name)
