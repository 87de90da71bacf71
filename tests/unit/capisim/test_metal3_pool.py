"""The simulator's Metal3 with a pool of BareMetalHosts: hosts registered once, claimed by a hostSelector,
provisioned, deprovisioned for the time set, available again; a Machine with no host waits, saying why."""

import threading
import time

import pytest

from capisim import Store
from capisim.capi_controller import CapiController, Provisioner
from capisim.metal3 import NO_HOST, SelectorError, selector_matches

NS = "metal3"
CAPI = "cluster.x-k8s.io"
INFRA = "infrastructure.cluster.x-k8s.io"


class PoolProvisioner(Provisioner):
    def __init__(self):
        self.booted = []  # (host, address, machine, node_type, user_data)
        self.released = []
        self.lock = threading.Lock()

    def provision(self, machine_name, node_type, user_data=None):
        raise AssertionError("a pool's Machine must boot a registered host, not a new one")

    def provision_host(self, host, address, machine_name, node_type, user_data=None):
        with self.lock:
            self.booted.append((host, address, machine_name, node_type, user_data))
        return host, address, 8, 16000

    def release(self, hostname):
        with self.lock:
            self.released.append(hostname)


def host(name, address, labels, state="available", annotations=None):
    return {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
            "metadata": {"name": name, "namespace": NS, "labels": labels, "annotations": annotations or {}},
            "spec": {"online": False, "bootMACAddress": "52:54:00:00:00:%02x" % int(address.rsplit(".", 1)[1]),
                     "bmc": {"address": "redfish://bmc/%s" % name, "credentialsName": name + "-bmc"}},
            "status": {"provisioning": {"state": state, "ID": name}, "operationalStatus": "OK", "poweredOn": False,
                       "errorCount": 0, "errorMessage": "", "provisioningFailCount": 0,
                       "hardware": {"cpu": {"count": 8}, "ramMebibytes": 16000, "hostname": name,
                                    "nics": [{"name": "eth0", "ip": address}]}}}


def deployment(name, cluster, node_type, template, replicas=0):
    labels = {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": name}
    return {"apiVersion": CAPI + "/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterName": cluster, "replicas": replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": dict(labels, **{"node-type": node_type})},
                                  "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": name + "-join"},
                                           "infrastructureRef": {"apiGroup": INFRA, "kind": "Metal3MachineTemplate",
                                                                 "name": template}}}}}


def template(name, selector, image="http://images/slurm.qcow2"):
    return {"apiVersion": INFRA + "/v1beta2", "kind": "Metal3MachineTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"template": {"spec": {"hostSelector": selector,
                                           "image": {"url": image, "checksum": image + ".sha256sum",
                                                     "checksumType": "sha256", "diskFormat": "qcow2"}}}}}


@pytest.fixture
def pool():
    store = Store()
    store.load([
        host("bm-01", "10.99.1.1", {"gpu": "true", "rack": "r1"}),
        host("bm-02", "10.99.1.2", {"gpu": "true", "rack": "r2"}),
        host("bm-03", "10.99.1.3", {"rack": "r1"}),
        template("slurm-gpu", {"matchLabels": {"gpu": "true"}}),
        template("k8s-any", {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1", "r2"]}]},
                 image="http://images/k8s.qcow2"),
        deployment("hpc-gpu", "hpc", "gpu", "slurm-gpu"),
        deployment("k8s-workers", "k8s", "worker", "k8s-any"),
    ], strict=True)
    prov = PoolProvisioner()
    ctl = CapiController(store, prov, interval=0.05, seed=3, deprovision_seconds=0.6)
    yield store, ctl, prov
    ctl.stop()


def get(store, group, plural, name):
    return store.get(store.resource(group, plural), NS, name)


def items(store, group, plural):
    return list(store.objects[(group, plural)].values())


def scale(store, name, replicas):
    res = store.resource(CAPI, "machinedeployments")
    md = store.get(res, NS, name)
    store.update(res, NS, name, dict(md, spec=dict(md["spec"], replicas=replicas)))


def machines_of(store, md, live=True):
    return [m for m in items(store, CAPI, "machines")
            if m["metadata"]["labels"].get("cluster.x-k8s.io/deployment-name") == md
            and (not live or not m["metadata"].get("deletionTimestamp"))]


def state(store, name):
    return get(store, "metal3.io", "baremetalhosts", name)["status"]["provisioning"]["state"]


def until(cond, timeout=10, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("%s not met in %s s" % (what, timeout))


def waiting_status(store, md):
    """The status of the MachineDeployment's first Metal3Machine, once there is one."""
    found = machines_of(store, md)
    return found and get(store, INFRA, "metal3machines", found[0]["metadata"]["name"]).get("status")


def phase(machine):
    return (machine.get("status") or {}).get("phase")


def test_a_machine_claims_an_available_host_its_selector_matches(pool):
    store, ctl, prov = pool
    scale(store, "hpc-gpu", 1)
    ctl.start()
    until(lambda: [phase(m) for m in machines_of(store, "hpc-gpu")] == ["Provisioned"], what="Provisioned")
    (machine,) = machines_of(store, "hpc-gpu")
    name = machine["metadata"]["name"]
    m3m = get(store, INFRA, "metal3machines", name)
    claimed = m3m["metadata"]["annotations"]["metal3.io/BareMetalHost"].split("/")[1]
    assert claimed in ("bm-01", "bm-02")  # the gpu hosts; bm-03 has no gpu label
    bmh = get(store, "metal3.io", "baremetalhosts", claimed)
    assert bmh["spec"]["consumerRef"] == {"apiVersion": INFRA + "/v1beta2", "kind": "Metal3Machine",
                                          "name": name, "namespace": NS}
    assert bmh["spec"]["image"]["url"] == "http://images/slurm.qcow2" and bmh["spec"]["image"]["format"] == "qcow2"
    assert bmh["spec"]["userData"] == {"name": "hpc-gpu-join", "namespace": NS}
    assert bmh["spec"]["online"] is True
    assert bmh["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"] == "hpc"
    assert bmh["status"]["provisioning"]["state"] == "provisioned"
    assert m3m["spec"]["hostSelector"] == {"matchLabels": {"gpu": "true"}}
    assert m3m["spec"]["providerID"] == "metal3://%s/%s/%s" % (NS, claimed, name)
    address = bmh["status"]["hardware"]["nics"][0]["ip"]
    assert {"type": "InternalIP", "address": address} in machine["status"]["addresses"]
    assert prov.booted == [(claimed, address, name, "gpu", None)]


def test_a_machine_with_no_host_to_claim_waits_in_provisioning_saying_why(pool):
    store, ctl, prov = pool
    scale(store, "hpc-gpu", 3)  # two gpu hosts
    ctl.start()
    until(lambda: sorted(phase(m) for m in machines_of(store, "hpc-gpu")) == ["Provisioned", "Provisioned",
                                                                              "Provisioning"], what="2 of 3")
    (waiting,) = [m for m in machines_of(store, "hpc-gpu") if phase(m) == "Provisioning"]
    m3m = get(store, INFRA, "metal3machines", waiting["metadata"]["name"])
    until(lambda: get(store, INFRA, "metal3machines", waiting["metadata"]["name"]).get("status"), what="a reason")
    status = get(store, INFRA, "metal3machines", waiting["metadata"]["name"])["status"]
    (cond,) = [c for c in status["conditions"] if c["type"] == "AssociateBareMetalHost"]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "AssociateBareMetalHostFailed", NO_HOST)
    assert status["deprecated"]["v1beta1"]["conditions"][0]["reason"] == "AssociateBMHFailed"
    assert "metal3.io/BareMetalHost" not in (m3m["metadata"].get("annotations") or {})
    assert state(store, "bm-03") == "available"  # never a host the selector does not match
    # the waiting condition is written once, not at every round of the loop
    rv = get(store, INFRA, "metal3machines", waiting["metadata"]["name"])["metadata"]["resourceVersion"]
    time.sleep(0.3)
    assert get(store, INFRA, "metal3machines", waiting["metadata"]["name"])["metadata"]["resourceVersion"] == rv


def test_a_deleted_machines_host_deprovisions_then_serves_the_waiting_machine(pool):
    store, ctl, prov = pool
    scale(store, "hpc-gpu", 2)
    ctl.start()
    until(lambda: [phase(m) for m in machines_of(store, "hpc-gpu")] == ["Provisioned"] * 2, what="2 Provisioned")
    scale(store, "k8s-workers", 3)  # any rack: only bm-03 is left; two wait
    until(lambda: sorted(phase(m) for m in machines_of(store, "k8s-workers")) ==
          ["Provisioned", "Provisioning", "Provisioning"], what="one worker")
    leaving = machines_of(store, "hpc-gpu")[0]
    name = leaving["metadata"]["name"]
    claimed = get(store, INFRA, "metal3machines", name)["metadata"]["annotations"]["metal3.io/BareMetalHost"]
    claimed = claimed.split("/")[1]
    annotations = dict(leaving["metadata"].get("annotations") or {}, **{"cluster.x-k8s.io/delete-machine": "yes"})
    res = store.resource(CAPI, "machines")
    store.update(res, NS, name, dict(leaving, metadata=dict(leaving["metadata"], annotations=annotations)))
    scale(store, "hpc-gpu", 1)
    until(lambda: state(store, claimed) == "deprovisioning", what="deprovisioning")
    bmh = get(store, "metal3.io", "baremetalhosts", claimed)
    assert bmh["spec"]["consumerRef"]["name"] == name  # held until deprovisioned
    assert "image" not in bmh["spec"] and bmh["spec"]["online"] is False
    assert store.get(res, NS, name)  # the Machine is still there while its host deprovisions
    assert claimed in prov.released
    # then available, released, and claimed by a waiting worker (its selector matches every rack)
    until(lambda: ((get(store, "metal3.io", "baremetalhosts", claimed)["spec"].get("consumerRef") or {})
                   .get("name", "").startswith("k8s-workers-")), what="claimed by a worker")
    until(lambda: name not in {m["metadata"]["name"] for m in items(store, CAPI, "machines")}, what="Machine gone")
    until(lambda: state(store, claimed) == "provisioned", what="provisioned again")
    assert get(store, "metal3.io", "baremetalhosts", claimed)["spec"]["image"]["url"] == "http://images/k8s.qcow2"
    assert [b[0] for b in prov.booted].count(claimed) == 2
    events = [what for dummy, who, what in ctl.events if who == name]
    assert events.index("deprovisioning host " + claimed) < events.index("host %s available" % claimed) \
        < events.index("deleted")


def test_paused_unhealthy_and_failed_hosts_are_never_claimed(pool):
    store, ctl, prov = pool
    res = store.resource("metal3.io", "baremetalhosts")
    for name, change in (("bm-01", {"annotations": {"baremetalhost.metal3.io/paused": ""}}),
                         ("bm-02", {"annotations": {"capm3.metal3.io/unhealthy": ""}})):
        bmh = store.get(res, NS, name)
        store.update(res, NS, name, dict(bmh, metadata=dict(bmh["metadata"], **change)))
    scale(store, "hpc-gpu", 1)
    ctl.start()
    until(lambda: waiting_status(store, "hpc-gpu"), what="a reason")
    assert [phase(m) for m in machines_of(store, "hpc-gpu")] == ["Provisioning"] and not prov.booted


@pytest.mark.parametrize("selector, labels, expected", [
    ({"matchLabels": {"gpu": "true"}}, {"gpu": "true", "rack": "r1"}, True),
    ({"matchLabels": {"gpu": "true"}}, {"rack": "r1"}, False),
    ({"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}, {"rack": "r1"}, True),
    ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]}, {"rack": "r1"}, False),
    ({"matchExpressions": [{"key": "rack", "operator": "NotIn", "values": ["r1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"gpu": "x"}, True),
    ({"matchExpressions": [{"key": "gpu", "operator": "!"}]}, {"gpu": "x"}, False),
    ({"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["32"]}]}, {"cores": "64"}, True),
    ({"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["32"]}]}, {"cores": "64"}, False),
    (None, {"anything": "x"}, True),
])
def test_host_selector_as_capm3_builds_it(selector, labels, expected):
    assert selector_matches(selector, labels) is expected


def test_an_operator_capm3_cannot_build_is_the_metal3machines_reason(pool):
    """CAPM3 lower-cases the operator: DoesNotExist is not one it can build (it takes "!")."""
    store, ctl, prov = pool
    with pytest.raises(SelectorError, match="DoesNotExist"):
        selector_matches({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, {})
    res = store.resource(INFRA, "metal3machinetemplates")
    tpl = store.get(res, NS, "slurm-gpu")
    tpl["spec"]["template"]["spec"]["hostSelector"] = {"matchExpressions": [{"key": "gpu",
                                                                            "operator": "DoesNotExist"}]}
    store.update(res, NS, "slurm-gpu", tpl)
    scale(store, "hpc-gpu", 1)
    ctl.start()
    until(lambda: waiting_status(store, "hpc-gpu"), what="a reason")
    name = machines_of(store, "hpc-gpu")[0]["metadata"]["name"]
    (cond,) = get(store, INFRA, "metal3machines", name)["status"]["conditions"]
    assert cond["status"] == "False" and "DoesNotExist" in cond["message"]
    assert not prov.booted


def test_the_command_provisioner_boots_a_pools_host_with_the_bootstrap_data(tmp_path):
    """The lab's provisioner: `CMD machine-boot HOST ADDRESS NODE_TYPE [USER_DATA_FILE]` (mode 0600)."""
    from capisim.__main__ import CommandProvisioner  # pylint: disable=import-outside-toplevel
    script = tmp_path / "boot.sh"
    seen = tmp_path / "seen"
    script.write_text('#!/bin/sh\necho "$@" >%s\nstat -c %%a "$5" >>%s\ncat "$5" >>%s\necho "$2 $3 4 8000"\n'
                      % (seen, seen, seen))
    script.chmod(0o755)
    prov = CommandProvisioner(str(script))
    assert prov.provision_host("bm-07", "10.99.1.7", "hpc-gpu-abcde", "gpu", b"#cloud-config\n") == \
        ("bm-07", "10.99.1.7", 4, 8000)
    lines = seen.read_text().splitlines()
    assert lines[0].startswith("machine-boot bm-07 10.99.1.7 gpu /") and lines[1:] == ["600", "#cloud-config"]


def test_a_workload_cluster_is_named_on_the_command_line(tmp_path):
    from capisim.__main__ import parse_workload  # pylint: disable=import-outside-toplevel
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cluster, workload = parse_workload("k8s=https://127.0.0.1:6444,%s" % token)
    assert (cluster, workload.url, workload.token) == ("k8s", "https://127.0.0.1:6444", "s3cret")
    for bad in ("k8s", "k8s=127.0.0.1:6444,%s" % token, "=https://x,%s" % token, "k8s=https://x"):
        with pytest.raises(SystemExit, match="expected CLUSTER=URL,TOKEN_FILE"):
            parse_workload(bad)
