"""A Kubernetes workload cluster on the bare-metal pool, its API a real kube-apiserver: a worker Machine's
Node appears there with the host's GPUs once the host has booted (nodeRef, phase Running); a GPU Pod
waiting for a node is a real Pending object; on deletion the simulator does what Cluster API does -
cordon, evict the Pods on the Node, then the host is deprovisioned and the Node deleted."""

import threading
import time

from conftest import ADMIN_TOKEN
from capisim import Store
from capisim.capi_controller import CapiController, Provisioner
from capisim.workload import WorkloadCluster

NS = "metal3"
CAPI = "cluster.x-k8s.io"
INFRA = "infrastructure.cluster.x-k8s.io"
POOL = "converged.hpc/pool"


class Booted(Provisioner):
    def __init__(self):
        self.lock = threading.Lock()

    def provision(self, machine_name, node_type, user_data=None):
        raise AssertionError("a pool's Machine boots a registered host")

    def provision_host(self, host, address, machine_name, node_type, user_data=None):
        return host, address, 8, 16000

    def release(self, hostname):
        pass


def objects(prefix):
    hosts = [{"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
              "metadata": {"name": "%s-bm-%02d" % (prefix, i), "namespace": NS,
                           "labels": {"gpu": "true", "nvidia.com/gpu.count": "2", POOL: "k8s-gpu"}},
              "spec": {"online": False},
              "status": {"provisioning": {"state": "available", "ID": str(i)}, "operationalStatus": "OK",
                         "poweredOn": False, "errorCount": 0, "errorMessage": "", "provisioningFailCount": 0,
                         "hardware": {"nics": [{"name": "eth0", "ip": "10.99.2.%d" % i}]}}} for i in (1, 2)]
    labels = {"cluster.x-k8s.io/cluster-name": "k8s", "cluster.x-k8s.io/deployment-name": "k8s-gpu"}
    return hosts + [
        {"apiVersion": INFRA + "/v1beta2", "kind": "Metal3MachineTemplate", "metadata": {"name": "k8s-gpu", "namespace": NS},
         "spec": {"template": {"spec": {"hostSelector": {"matchLabels": {POOL: "k8s-gpu"}},
                                        "image": {"url": "http://images/k8s.qcow2"}}}}},
        {"apiVersion": CAPI + "/v1beta2", "kind": "MachineDeployment", "metadata": {"name": "k8s-gpu", "namespace": NS},
         "spec": {"clusterName": "k8s", "replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": dict(labels, **{"node-type": "k8s-gpu"})},
                               "spec": {"clusterName": "k8s", "bootstrap": {"dataSecretName": "k8s-gpu"},
                                        "infrastructureRef": {"apiGroup": INFRA, "kind": "Metal3MachineTemplate",
                                                              "name": "k8s-gpu"}}}}}]


def until(cond, timeout=20, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("%s not met in %s s" % (what, timeout))


def pod(name, node=None, gpus=1):
    spec = {"automountServiceAccountToken": False,
            "containers": [{"name": "c", "image": "registry.invalid/cuda:12",
                            "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def test_a_workers_node_is_registered_drained_and_deleted_as_cluster_api_does(kube, kube_ns):
    api = kube.api()
    store = Store()
    store.load(objects(kube_ns), strict=True)
    workload = WorkloadCluster(kube.url, ADMIN_TOKEN, kube.ca_cert)
    ctl = CapiController(store, Booted(), interval=0.05, seed=2, deprovision_seconds=0.3, workloads={"k8s": workload})
    ctl.start()
    try:
        machines = store.objects[(CAPI, "machines")]
        until(lambda: [(m.get("status") or {}).get("phase") for m in machines.values()] == ["Running"], what="Running")
        (machine,) = machines.values()
        node = machine["status"]["nodeRef"]["name"]
        found = api.get("v1", "nodes", None, node)
        assert found["status"]["capacity"]["nvidia.com/gpu"] == "2"
        assert found["metadata"]["labels"]["node-type"] == "k8s-gpu"
        assert [c["status"] for c in found["status"]["conditions"] if c["type"] == "Ready"] == ["True"]
        # a Pod running there and a GPU Pod no node has taken yet: real objects on the real server
        api.ok("POST", "/api/v1/namespaces/%s/serviceaccounts" % kube_ns,
               {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        api.ok("POST", "/api/v1/namespaces/%s/pods" % kube_ns, pod("trainer", node))
        api.ok("POST", "/api/v1/namespaces/%s/pods" % kube_ns, pod("waiting", gpus=2))
        assert api.get("v1", "pods", kube_ns, "waiting")["status"]["phase"] == "Pending"
        # the MachineDeployment scaled to 0: cordon, evict, deprovision, Node gone, Machine gone
        res = store.resource(CAPI, "machinedeployments")
        md = store.get(res, NS, "k8s-gpu")
        store.update(res, NS, "k8s-gpu", dict(md, spec=dict(md["spec"], replicas=0)))
        name = machine["metadata"]["name"]
        until(lambda: name not in {m["metadata"]["name"] for m in machines.values()}, what="Machine gone")
        assert api.get("v1", "nodes", None, node) is None
        assert api.get("v1", "pods", kube_ns, "trainer") is None  # evicted
        assert api.get("v1", "pods", kube_ns, "waiting") is not None  # not on that node: untouched
        events = [what for dummy, who, what in ctl.events if who == name]
        order = [next(i for i, e in enumerate(events) if e.startswith(p))
                 for p in ("node %s registered" % node, "node %s drained (1 Pod(s) evicted)" % node,
                           "deprovisioning host", "host %s available" % node, "node %s deleted" % node, "deleted")]
        assert order == sorted(order), events
        assert not ctl.errors
    finally:
        ctl.stop()
