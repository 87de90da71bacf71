"""The simulator's Cluster API controller scales MachineDeployments and honours deletion hooks as CAPI does."""

import base64
import copy
import threading
import time

import pytest

from conftest import load_fixture
from capisim import Store
from capisim.store import ApiError
from capisim.capi_controller import PRE_DRAIN, PRE_TERMINATE, CapiController, Provisioner

NS = "metal3"
MD = "hpc-compute"


class FakeProvisioner(Provisioner):
    def __init__(self):
        self.count = 0
        self.released = []
        self.user_data = {}
        self.lock = threading.Lock()

    def provision(self, machine_name, node_type, user_data=None):
        with self.lock:
            self.count += 1
            n = self.count
            self.user_data[machine_name] = user_data
        return "new-cn-%02d" % n, "10.99.0.%d" % n, 4, 8000

    def release(self, hostname):
        self.released.append(hostname)


@pytest.fixture
def world():
    store = Store()
    store.load(load_fixture("capi-hpc.yaml"))
    prov = FakeProvisioner()
    ctl = CapiController(store, prov, interval=0.05, seed=1)
    yield store, ctl, prov
    ctl.stop()


def machines(store, deleting=None):
    out = []
    for m in store.objects[("cluster.x-k8s.io", "machines")].values():
        if (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name") != MD:
            continue
        if deleting is None or bool(m["metadata"].get("deletionTimestamp")) == deleting:
            out.append(m)
    return out


def scale(store, replicas):
    res = store.resource("cluster.x-k8s.io", "machinedeployments")
    md = store.get(res, NS, MD)
    body = dict(md, spec=dict(md["spec"], replicas=replicas))
    store.update(res, NS, MD, body)


def until(cond, timeout=10):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.05)
    raise AssertionError("condition not met in %s s" % timeout)


def annotate(store, name, key, value):
    res = store.resource("cluster.x-k8s.io", "machines")
    m = store.get(res, NS, name)
    meta = dict(m["metadata"], annotations=dict(m["metadata"].get("annotations") or {}))
    if value is None:
        meta["annotations"].pop(key, None)
    else:
        meta["annotations"][key] = value
    store.update(res, NS, name, dict(m, metadata=meta))


def test_scale_up_creates_provisioned_machines_with_template_labels(world):
    store, ctl, prov = world
    before = len(machines(store, deleting=False))
    scale(store, before + 1)  # the fixture's deleting Machine is not counted
    ctl.reconcile()
    ctl.start()
    until(lambda: len([m for m in machines(store, False) if m.get("status", {}).get("phase") == "Provisioned"
                       and m["metadata"]["name"].startswith(MD + "-")]) >= 1)
    new = [m for m in machines(store, False) if m["metadata"]["name"] not in
           {d["metadata"]["name"] for d in load_fixture("capi-hpc.yaml")}]
    assert len(new) == 1  # replicas count live Machines; the deleting one is not among them
    m = new[0]
    assert m["metadata"]["labels"]["node-type"] == "compute"
    assert "machine.cluster.x-k8s.io" in m["metadata"]["finalizers"]
    until(lambda: all(store.get(store.resource("cluster.x-k8s.io", "machines"), NS, x["metadata"]["name"])
                      .get("status", {}).get("addresses") for x in new))


def new_machines(store):
    fixture = {d["metadata"]["name"] for d in load_fixture("capi-hpc.yaml")}
    return [m for m in machines(store, False) if m["metadata"]["name"] not in fixture]


def test_a_template_with_a_bootstrap_provider_gives_each_machine_its_own_secret_name(world):
    store, ctl, prov = world
    scale(store, len(machines(store, deleting=False)) + 1)
    ctl.start()
    until(lambda: len(prov.user_data) == 1)
    (machine,) = new_machines(store)
    name = machine["metadata"]["name"]
    assert machine["spec"]["bootstrap"]["dataSecretName"] == name
    assert prov.user_data == {name: None}  # no such Secret: the host boots without bootstrap data


def test_a_template_naming_a_bootstrap_secret_hands_its_value_to_the_host(world):
    """As a MachineDeployment with spec.template.spec.bootstrap.dataSecretName (no bootstrap
    provider): every Machine names that Secret, and the host gets its `value` as user data."""
    store, ctl, prov = world
    cloud_config = b"#cloud-config\nwrite_files: [{path: /etc/joined, content: 'yes'}]\n"
    store.create(store.resource("", "secrets"), NS, {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "hpc-compute-join", "namespace": NS},
        "data": {"value": base64.b64encode(cloud_config).decode(), "format": base64.b64encode(b"cloud-config").decode()}})
    res = store.resource("cluster.x-k8s.io", "machinedeployments")
    md = store.get(res, NS, MD)
    template = copy.deepcopy(md["spec"]["template"])
    template["spec"]["bootstrap"] = {"dataSecretName": "hpc-compute-join"}
    store.update(res, NS, MD, dict(md, spec=dict(md["spec"], template=template,
                                                 replicas=len(machines(store, deleting=False)) + 2)))
    ctl.start()
    until(lambda: len(prov.user_data) == 2)
    assert sorted(m["spec"]["bootstrap"]["dataSecretName"] for m in new_machines(store)) == ["hpc-compute-join"] * 2
    assert list(prov.user_data.values()) == [cloud_config, cloud_config]


def test_scale_down_prefers_delete_machine_annotation_and_waits_for_pre_terminate_hook(world):
    store, ctl, prov = world
    victim = "hpc-compute-7d9f8-fghij"
    annotate(store, victim, "cluster.x-k8s.io/delete-machine", "yes")
    annotate(store, victim, PRE_TERMINATE + "/converged-hpc", "converged-hpc")
    live = len(machines(store, deleting=False))
    scale(store, live - 1)
    ctl.start()
    res = store.resource("cluster.x-k8s.io", "machines")
    until(lambda: store.get(res, NS, victim).get("status", {}).get("phase") == "Deleting")
    m = store.get(res, NS, victim)
    assert m["metadata"]["deletionTimestamp"]
    assert "waitForPreTerminateHookStartTime" in m["status"]["deletion"]
    time.sleep(0.5)
    assert store.get(res, NS, victim)  # held by the hook
    annotate(store, victim, PRE_TERMINATE + "/converged-hpc", None)
    until(lambda: (NS, victim) not in store.objects[("cluster.x-k8s.io", "machines")])
    assert "hpc-cn-02" in prov.released


def test_pre_drain_hook_is_skipped_without_node_ref(world):
    store, ctl, prov = world
    victim = "hpc-compute-7d9f8-abcde"  # phase Provisioned, no nodeRef
    annotate(store, victim, PRE_DRAIN + "/converged-hpc", "converged-hpc")
    store.delete(store.resource("cluster.x-k8s.io", "machines"), NS, victim)
    ctl.start()
    until(lambda: (NS, victim) not in store.objects[("cluster.x-k8s.io", "machines")])


def test_pre_drain_hook_holds_a_machine_with_node_ref(world):
    store, ctl, prov = world
    victim = "hpc-controller-5c6b9-x7k2p"  # Running with a nodeRef
    annotate(store, victim, PRE_DRAIN + "/converged-hpc", "converged-hpc")
    res = store.resource("cluster.x-k8s.io", "machines")
    store.delete(res, NS, victim)
    ctl.start()
    until(lambda: "waitForPreDrainHookStartTime" in (store.get(res, NS, victim).get("status", {}).get("deletion") or {}))
    annotate(store, victim, PRE_DRAIN + "/converged-hpc", None)
    until(lambda: (NS, victim) not in store.objects[("cluster.x-k8s.io", "machines")])


def test_deletion_order_newest(world):
    store, ctl, prov = world
    res = store.resource("cluster.x-k8s.io", "machinedeployments")
    md = store.get(res, NS, MD)
    store.update(res, NS, MD, dict(md, spec=dict(md["spec"], deletion={"order": "Newest"})))
    live = sorted(machines(store, deleting=False),
                  key=lambda m: (m["metadata"]["creationTimestamp"], m["metadata"]["name"]))
    scale(store, len(live) - 1)
    ctl.reconcile()
    requested = [name for dummy, name, what in ctl.events if what == "deletion requested"]
    assert requested == [live[-1]["metadata"]["name"]]
    # without hooks, CAPI goes straight on: the Machine is gone already
    assert ("metal3", requested[0]) not in store.objects[("cluster.x-k8s.io", "machines")]


def test_machine_pool_scales_machine_pool_machines_held_by_the_hook(world):
    store, ctl, prov = world
    pools = store.resource("cluster.x-k8s.io", "machinepools")
    store.create(pools, NS, {
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool",
        "metadata": {"name": "hpc-pool", "namespace": NS},
        "spec": {"clusterName": "hpc", "replicas": 2, "template": {
            "metadata": {"labels": {"node-type": "compute"},
                         "annotations": {PRE_TERMINATE + "/converged-hpc": "converged-hpc"}},
            "spec": {"clusterName": "hpc", "bootstrap": {"dataSecretName": "hpc-pool"},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "Metal3Machine", "name": "hpc-pool"}}}}})
    machines_res = store.resource("cluster.x-k8s.io", "machines")

    def pool_machines():
        return [m for m in store.objects[("cluster.x-k8s.io", "machines")].values()
                if (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/pool-name") == "hpc-pool"]
    ctl.start()
    until(lambda: len([m for m in pool_machines() if m.get("status", {}).get("phase") == "Provisioned"]) == 2)
    pool = store.get(pools, NS, "hpc-pool")
    until(lambda: store.get(pools, NS, "hpc-pool").get("status", {}).get("readyReplicas") == 2)
    for m in pool_machines():
        assert m["metadata"]["ownerReferences"] == [{
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachinePool", "name": "hpc-pool",
            "uid": pool["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        assert m["metadata"]["labels"]["node-type"] == "compute"
        assert "cluster.x-k8s.io/deployment-name" not in m["metadata"]["labels"]
    # scale down: the newest goes, and waits for our hook like any Machine
    newest = max(pool_machines(), key=lambda m: (m["metadata"]["creationTimestamp"], m["metadata"]["name"]))

    def scale_pool_to_one():  # the controller writes the pool's status meanwhile: a conflict means read again
        current = store.get(pools, NS, "hpc-pool")
        try:
            store.update(pools, NS, "hpc-pool", dict(current, spec=dict(current["spec"], replicas=1)))
        except ApiError as err:
            if err.code != 409:
                raise
            return False
        return True
    until(scale_pool_to_one)
    name = newest["metadata"]["name"]
    until(lambda: store.get(machines_res, NS, name).get("status", {}).get("phase") == "Deleting")
    assert len([m for m in pool_machines() if not m["metadata"].get("deletionTimestamp")]) == 1
    annotate(store, name, PRE_TERMINATE + "/converged-hpc", None)
    until(lambda: (NS, name) not in store.objects[("cluster.x-k8s.io", "machines")])
    until(lambda: store.get(pools, NS, "hpc-pool").get("status", {}).get("replicas") == 1)
