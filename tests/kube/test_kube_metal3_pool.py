"""The simulator's bare-metal pool writes objects a real kube-apiserver takes as they are: the lab's
registered BareMetalHosts, a host claimed and provisioned, one deprovisioning, a Metal3Machine that
claimed one and one that waits with its reason - created on the real server with the CRDs of
../shared/k8s/crds and fieldValidation=Strict (an unknown or misplaced field is refused, not
dropped), read back unchanged, and read by the inventory plugin as the collection reads them."""

import threading
import time

import capi_objects
from capisim import Store
from capisim.capi_controller import CapiController, Provisioner
from capisim.metal3 import NO_HOST

INFRA = "infrastructure.cluster.x-k8s.io"
SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "deletionTimestamp",
              "deletionGracePeriodSeconds", "selfLink")


class Booted(Provisioner):
    def __init__(self):
        self.lock = threading.Lock()
        self.hosts = []

    def provision(self, machine_name, node_type, user_data=None):
        raise AssertionError("a pool's Machine boots a registered host")

    def provision_host(self, host, address, machine_name, node_type, user_data=None):
        with self.lock:
            self.hosts.append(host)
        return host, address, 2, 2000

    def release(self, hostname):
        pass


def until(cond, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("not reached in %s s" % timeout)


def pool_world():
    """A pool of 3 hosts (1 GPU); compute wants 3 (2 hosts without a GPU: one Machine waits), gpu 1, then
    the gpu Machine is deleted and its host caught deprovisioning."""
    store = Store()
    docs = capi_objects.objects([], "hpc", 2, 2000, replicas={"compute": 3, "gpu": 1})
    docs += capi_objects.bare_metal_objects("hpc", 3, 1, "10.89.99", 2, 2000)
    store.load(docs, strict=True)
    ctl = CapiController(store, Booted(), interval=0.05, seed=5, deprovision_seconds=30)
    ctl.start()

    def machines(md):
        return [m for m in store.objects[("cluster.x-k8s.io", "machines")].values()
                if m["metadata"]["labels"].get("cluster.x-k8s.io/deployment-name") == md]
    until(lambda: sorted((m.get("status") or {}).get("phase") for m in machines("hpc-compute"))
          == ["Provisioned", "Provisioned", "Provisioning"]
          and [(m.get("status") or {}).get("phase") for m in machines("hpc-gpu")] == ["Provisioned"])
    until(lambda: all((m3m.get("status") or {}).get("conditions")
                      for m3m in store.objects[(INFRA, "metal3machines")].values()))
    res = store.resource("cluster.x-k8s.io", "machinedeployments")
    md = store.get(res, "metal3", "hpc-gpu")
    store.update(res, "metal3", "hpc-gpu", dict(md, spec=dict(md["spec"], replicas=0)))
    (gpu,) = machines("hpc-gpu")  # released by scale_down.yml in the lab: here, by hand
    machine_res = store.resource("cluster.x-k8s.io", "machines")
    until(lambda: store.get(machine_res, "metal3", gpu["metadata"]["name"])["metadata"].get("deletionTimestamp"))
    gpu = store.get(machine_res, "metal3", gpu["metadata"]["name"])
    store.update(machine_res, "metal3", gpu["metadata"]["name"],
                 dict(gpu, metadata=dict(gpu["metadata"], annotations={})))
    until(lambda: any(((b.get("status") or {}).get("provisioning") or {}).get("state") == "deprovisioning"
                      for b in store.objects[("metal3.io", "baremetalhosts")].values()))
    ctl.stop()
    return store


def strip(obj):
    meta = {k: v for k, v in obj["metadata"].items() if k not in SERVER_SET}
    return dict(obj, metadata=meta)


def test_the_pools_objects_are_taken_by_a_real_server_as_they_are(kube, kube_ns):
    store = pool_world()
    api = kube.api()
    sent = {}
    for plural, group in (("baremetalhosts", "metal3.io"), ("metal3machines", INFRA)):
        for obj in store.objects[(group, plural)].values():
            body = strip(obj)
            body["metadata"] = dict(body["metadata"], namespace=kube_ns)
            body["metadata"].pop("ownerReferences", None)  # owners' uids are the simulator's
            status = body.pop("status", None)
            created = api.ok("POST", api.path(body["apiVersion"], plural, kube_ns), body,
                             query={"fieldValidation": "Strict"})
            if status:
                created["status"] = status
                created = api.ok("PUT", api.obj_path(created, "status"), created,
                                 query={"fieldValidation": "Strict"})
            sent[(plural, body["metadata"]["name"])] = (body, status)
    states, reasons = [], []
    for (plural, name), (body, status) in sent.items():
        back = api.get(body["apiVersion"], plural, kube_ns, name)
        assert back["spec"] == body["spec"], name  # nothing pruned
        if status:
            assert back["status"] == status, name
        if plural == "baremetalhosts":
            states.append(back["status"]["provisioning"]["state"])
        else:
            reasons += [c["message"] for c in (back.get("status") or {}).get("conditions") or [] if c["message"]]
    assert sorted(states) == ["deprovisioning", "provisioned", "provisioned"]
    assert reasons == [NO_HOST]
