"""The real servers `make kube-assets` builds, working together: kube-apiserver and etcd, the Cluster API
core manager, CAPM3 and the Bare Metal Operator in its test mode, on loopback, with the CRDs of the
controllers' own module versions.

What a site's management cluster does with bare metal, end to end and judged only by the controllers:
BareMetalHosts registered with BMC credentials go to available; a MachineDeployment of 2 whose
Metal3MachineTemplate selects hosts by label claims two of them (not the one the selector leaves out),
its Machines reach Provisioned with the providerID CAPM3 gives; scaled to 0 it gives both hosts back,
deprovisioned to available, and its Machines and Metal3Machines are gone. And the collection's own part
on them: the inventory, and our pre-terminate hook holding a Machine Cluster API deletes until the
lifecycle playbooks' release.
"""

import base64
import json
import os
import subprocess
import threading
import time

import pytest
import yaml

import kubeapi
import test_kube_lifecycle_writes as lifecycle
from test_kube_inventory import listing
from conftest import HOOK, REPO, ansible_env

CAPI = "cluster.x-k8s.io/v1beta2"
INFRA = "infrastructure.cluster.x-k8s.io/v1beta2"
BMH = "metal3.io/v1alpha1"
NS = "smoke"
CLUSTER = "smoke"
MD = "smoke-workers"
POOL_LABEL = "converged.hpc/smoke-pool"

ASSETS = kubeapi.assets()[0]
MISSING = [b for b in kubeapi.Controllers.BINARIES if not (ASSETS and os.access(os.path.join(ASSETS, b), os.X_OK))]
pytestmark = pytest.mark.skipif(bool(MISSING), reason="no %s in $KUBEBUILDER_ASSETS (make kube-assets builds them)"
                                % ", ".join(MISSING))


@pytest.fixture(scope="module")
def management(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("management")
    server = kubeapi.KubeApiServer(str(workdir / "apiserver"), crds=kubeapi.module_crds())
    server.start()
    # (the workload cluster's test: its control plane Machine's nodeRef at the next resync, kubeapi.Controllers)
    controllers = kubeapi.Controllers(server, str(workdir / "controllers"), sync_period=30)
    try:
        controllers.start()
    except Exception:
        controllers.stop()
        server.stop()
        raise
    yield server, controllers
    controllers.stop()
    server.stop()


def b64(text):
    return base64.b64encode(text.encode()).decode()


def wait_for(what, predicate, controllers, timeout=180):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(1)
    logs = "\n".join("--- %s\n%s" % (name, controllers.log_tail(name, 8)) for name in controllers.BINARIES)
    pytest.fail("%s: not within %d s\n%s" % (what, timeout, logs))


def host_states(api, ns):
    return {h["metadata"]["name"]: ((h.get("status") or {}).get("provisioning") or {}).get("state")
            for h in api.list(BMH, "baremetalhosts", ns)}


def register_hosts(api, ns, hosts):
    """What a site writes for its hosts: BMC credentials, and a BareMetalHost per host, labelled."""
    api.namespace(ns)
    api.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "bmc", "namespace": ns},
                "data": {"username": b64("admin"), "password": b64("not-a-real-bmc")}})
    for i, (name, pool) in enumerate(sorted(hosts.items())):
        api.create({"apiVersion": BMH, "kind": "BareMetalHost",
                    "metadata": {"name": name, "namespace": ns, "labels": {POOL_LABEL: pool}},
                    "spec": {"online": True, "bootMACAddress": "52:54:00:5e:%02x:%02x" % (len(ns), i),
                             "bmc": {"address": "ipmi://127.0.0.1:%d" % (6230 + i), "credentialsName": "bmc"}}})


def make_cluster(server, controllers, ns, cluster, md, replicas, node_type=None):
    """The cluster (Cluster, Metal3Cluster, the kubeconfig Secret the controllers reach it through) and its
    workers: bootstrap data, a Metal3MachineTemplate selecting the pool's hosts, a MachineDeployment."""
    api = server.api()
    kubeconfig = server.kubeconfig(os.path.join(controllers.workdir, ns + ".kubeconfig"), context=cluster)
    with open(kubeconfig) as fh:
        api.create({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                    "metadata": {"name": cluster + "-kubeconfig", "namespace": ns,
                                 "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
                    "data": {"value": b64(fh.read())}})
    api.create({"apiVersion": INFRA, "kind": "Metal3Cluster", "metadata": {"name": cluster, "namespace": ns},
                "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443}}})
    api.create({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": cluster, "namespace": ns},
                "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster",
                                               "name": cluster}}})
    api.create({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                "metadata": {"name": md + "-bootstrap", "namespace": ns,
                             "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
                "data": {"value": b64("#cloud-config\nruncmd: [[true]]\n"), "format": b64("cloud-config")}})
    api.create({"apiVersion": INFRA, "kind": "Metal3MachineTemplate", "metadata": {"name": md, "namespace": ns},
                "spec": {"template": {"spec": {
                    "image": {"url": "http://127.0.0.1:8080/debian.qcow2", "checksumType": "sha256",
                              "checksum": "0" * 64, "diskFormat": "qcow2"},
                    "hostSelector": {"matchLabels": {POOL_LABEL: "pool"}}}}}})
    labels = {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": md}
    template_labels = dict(labels, **({"node-type": node_type} if node_type else {}))
    api.create({"apiVersion": CAPI, "kind": "MachineDeployment",
                "metadata": {"name": md, "namespace": ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
                "spec": {"clusterName": cluster, "replicas": replicas, "selector": {"matchLabels": labels},
                         # what Cluster API's defaulting webhook would write (none is installed here)
                         "rollout": {"strategy": {"type": "RollingUpdate",
                                                  "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                         "template": {"metadata": {"labels": template_labels}, "spec": {
                             "clusterName": cluster, "bootstrap": {"dataSecretName": md + "-bootstrap"},
                             "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                   "kind": "Metal3MachineTemplate", "name": md}}}}})


def provisioned_machines(api, ns, count):
    machines = api.list(CAPI, "machines", ns)
    done = [m for m in machines if (m.get("status") or {}).get("phase") == "Provisioned"]
    return machines if len(machines) == count and len(done) == count else None


def test_hosts_claimed_provisioned_and_given_back(management):
    server, controllers = management
    api = server.api()
    register_hosts(api, NS, {"smoke-host-0": "pool", "smoke-host-1": "pool", "smoke-host-2": "elsewhere"})
    wait_for("the three hosts available", lambda: set(host_states(api, NS).values()) == {"available"}, controllers)
    make_cluster(server, controllers, NS, CLUSTER, MD, 2)
    machines = wait_for("two Machines Provisioned", lambda: provisioned_machines(api, NS, 2), controllers)
    states = host_states(api, NS)
    assert states == {"smoke-host-0": "provisioned", "smoke-host-1": "provisioned", "smoke-host-2": "available"}
    claimed = {}
    for machine in machines:
        m3m = api.get(INFRA, "metal3machines", NS, machine["spec"]["infrastructureRef"]["name"])
        host_ns, host = m3m["metadata"]["annotations"]["metal3.io/BareMetalHost"].split("/")
        assert host_ns == NS
        claimed[host] = machine["metadata"]["name"]
        # CAPM3's providerID names the host and the Metal3Machine; Cluster API copies it to the Machine
        assert machine["spec"]["providerID"] == "metal3://%s/%s/%s" % (NS, host, m3m["metadata"]["name"])
        bmh = api.get(BMH, "baremetalhosts", NS, host)
        assert bmh["spec"]["consumerRef"]["name"] == m3m["metadata"]["name"]
        # the Machine's bootstrap data reaches the host as its user data
        assert bmh["spec"]["userData"]["name"] == MD + "-bootstrap"
        assert bmh["spec"]["image"]["url"] == "http://127.0.0.1:8080/debian.qcow2"
    assert sorted(claimed) == ["smoke-host-0", "smoke-host-1"]

    # ---- scaled to 0 through /scale: the Machines go, the hosts are deprovisioned and available again
    api.patch(CAPI, "machinedeployments", NS, MD, {"spec": {"replicas": 0}}, sub="scale")
    wait_for("the Machines and Metal3Machines gone",
             lambda: not api.list(CAPI, "machines", NS) and not api.list(INFRA, "metal3machines", NS), controllers)
    wait_for("both hosts available again", lambda: set(host_states(api, NS).values()) == {"available"}, controllers)
    for host in claimed:
        assert not api.get(BMH, "baremetalhosts", NS, host)["spec"].get("consumerRef")


def test_versions_are_the_pinned_ones(management):
    """The binaries are the versions kube-assets/*/go.mod pin: kube-apiserver says its own (stamped at
    build), the server reports it, and the versions file names each module."""
    server = management[0]
    with open(os.path.join(ASSETS, "versions")) as fh:
        versions = dict(line.split() for line in fh if line.strip())
    pinned = {}
    for module_dir, module in (("apiserver", "k8s.io/kubernetes"), ("controllers", "sigs.k8s.io/cluster-api"),
                               ("controllers", "github.com/metal3-io/cluster-api-provider-metal3"),
                               ("controllers", "github.com/metal3-io/baremetal-operator")):
        with open(os.path.join(kubeapi.HERE, "..", "kube-assets", module_dir, "go.mod")) as fh:
            pinned[module] = next(line.split()[1] for line in fh if line.strip().startswith(module + " "))
    assert versions["kube-apiserver"] == pinned["k8s.io/kubernetes"]
    assert versions["cluster-api"] == pinned["sigs.k8s.io/cluster-api"]
    assert versions["cluster-api-provider-metal3"] == pinned["github.com/metal3-io/cluster-api-provider-metal3"]
    assert versions["baremetal-operator"] == pinned["github.com/metal3-io/baremetal-operator"]
    assert server.api().ok("GET", "/version")["gitVersion"] == pinned["k8s.io/kubernetes"]
    # the CRDs installed are those of the controllers' modules: v1beta2 stored for Cluster API and CAPM3
    crd = server.api().ok("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                 "metal3machinetemplates.infrastructure.cluster.x-k8s.io")
    assert [v["name"] for v in crd["spec"]["versions"] if v["storage"]] == ["v1beta2"]
    assert crd["metadata"]["labels"]["cluster.x-k8s.io/v1beta2"] == "v1beta2"
    with open(os.path.join(ASSETS, "crds", "capm3", "infrastructure.cluster.x-k8s.io_metal3machinetemplates.yaml")) \
            as fh:
        assert yaml.safe_load(fh)["spec"]["versions"][-1]["name"] == "v1beta2"


def deleting_reason(machine):
    return next((c.get("reason") for c in (machine.get("status") or {}).get("conditions") or []
                 if c["type"] == "Deleting"), None)


def test_the_collection_holds_a_machine_for_the_real_cluster_api(management, tmp_path):
    """The collection's part, judged by the real controllers: the inventory plugin finds the Provisioned
    Machine in its node type's group, with the hardware the Bare Metal Operator inspected; scale-up's hold
    (tasks/hold_machine.yml) puts our pre-terminate hook; scaled to 0, Cluster API deletes the Machine but
    waits on the hook, the host staying provisioned; scale-down's release (tasks/release_machine.yml)
    lets it go, and the host is deprovisioned to available."""
    server, controllers = management
    api = server.api()
    ns = "lifecycle"
    register_hosts(api, ns, {"hpc-host-0": "pool"})
    wait_for("the host available", lambda: set(host_states(api, ns).values()) == {"available"}, controllers)
    make_cluster(server, controllers, ns, "hpc", "hpc-compute", 1, node_type="compute")
    (machine,) = wait_for("the Machine Provisioned", lambda: provisioned_machines(api, ns, 1), controllers)
    name = machine["metadata"]["name"]
    assert machine["metadata"]["labels"]["node-type"] == "compute"  # the template's labels reach the Machine

    # the host's address is the one the Bare Metal Operator's fixture inspected (192.168.100.1): the plays
    # run every task on localhost, and a local connection makes sure nothing is ever sent to it
    inv = str(tmp_path / "mgmt.capi_machines.yml")
    with open(inv, "w") as fh:
        yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "namespaces": [ns], "host": server.url,
                        "api_key": kubeapi.ADMIN_TOKEN, "ca_cert": server.ca_cert,
                        "compose": {"ansible_connection": "'local'"}}, fh)
    listed = subprocess.run(["ansible-inventory", "-i", inv, "--list"], cwd=REPO, capture_output=True, text=True,
                            env=ansible_env(), check=False, timeout=120)
    assert kubeapi.ADMIN_TOKEN not in listed.stdout + listed.stderr
    found = listing(listed)
    assert found["compute"]["hosts"] == [name], listed.stdout[-2000:]
    bmh = api.get(BMH, "baremetalhosts", ns, "hpc-host-0")["status"]["hardware"]
    hostvars = found["_meta"]["hostvars"][name]
    assert hostvars["capi"]["phase"] == "Provisioned" and hostvars["ansible_connection"] == "local"
    assert (hostvars["capi"]["cpus"], hostvars["capi"]["ram_mib"]) == (bmh["cpu"]["count"], bmh["ramMebibytes"])

    proc = lifecycle.playbook(server, tmp_path, inv, lifecycle.HOOK_PLAY.format(repo=REPO))
    assert proc.returncode == 0 and "not held: none" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert api.get(CAPI, "machines", ns, name)["metadata"]["annotations"][HOOK] == "converged-hpc"

    api.patch(CAPI, "machinedeployments", ns, "hpc-compute", {"spec": {"replicas": 0}}, sub="scale")
    wait_for("Cluster API waiting on our hook",
             lambda: deleting_reason(api.get(CAPI, "machines", ns, name)) == "WaitingForPreTerminateHook", controllers)
    time.sleep(12)  # longer than the Bare Metal Operator's 10 s requeue: the host would be going by now
    held = api.get(CAPI, "machines", ns, name)
    assert held["metadata"]["deletionTimestamp"] and held["status"]["phase"] == "Deleting"
    assert host_states(api, ns) == {"hpc-host-0": "provisioned"}
    assert api.list(INFRA, "metal3machines", ns)

    proc = lifecycle.playbook(server, tmp_path, inv, lifecycle.HOOK_PLAY.format(repo=REPO))
    assert proc.returncode == 0 and "changed=1" in proc.stdout.split("PLAY RECAP")[-1], proc.stdout[-3000:]
    wait_for("the Machine gone", lambda: api.get(CAPI, "machines", ns, name) is None, controllers)
    wait_for("the host available again", lambda: host_states(api, ns) == {"hpc-host-0": "available"}, controllers)


FAKE_MACHINES = '''import json, sys
args = sys.argv[1:]
entry = {"args": args}
if args[0] == "machine-boot" and len(args) == 5:
    entry["user_data"] = open(args[4]).read()
with open(sys.argv[0] + ".log", "a") as fh:
    fh.write(json.dumps(entry) + "\\n")
if args[0] == "machine-boot":
    print("%s %s 2 2000" % (args[1], args[2]))
'''


def test_the_lab_host_agent_boots_and_removes_what_the_controllers_provision(management, tmp_path):
    """The lab's real management cluster as lab/lab.sh writes it (lab/capi_objects.py: hosts with their
    hardware details annotation and BMC Secrets, a MachineDeployment and its template; lab/mgmt.py: the
    cluster's kubeconfig Secret) and its host agent (lab/hostagent.py) with a stand-in for lab/machines.py
    that records what it is asked: the host CAPM3 claims is booted once, with the node type its image names,
    the address its hardware details give and the Machine's bootstrap data; the Machine is named by Cluster
    API and carries the host's name as its Hostname address; scaled to 0, the machine is removed and the
    host given back is kept unclaimable (paused) for the deprovisioning time, then released."""
    import capi_objects
    import hostagent
    import mgmt
    server, controllers = management
    api = server.api()
    hosts = [("lab-cn-01", "10.89.99.21", "compute"), ("lab-cn-02", "10.89.99.22", "compute")]
    docs = capi_objects.real_objects(hosts[:1], "lab", 2, 2000, 6443)
    for index, (name, address, node_type) in enumerate(hosts):
        docs += capi_objects.real_host("lab", name, address, node_type, 2, 2000, index)
    docs = [d for d in docs if d["kind"] != "MachineDeployment"] + [d for d in docs if d["kind"] == "MachineDeployment"]
    # (without our hook: no Slurm here to drain, the Machine goes when scaled away)
    docs[-1]["spec"]["template"]["metadata"]["annotations"].pop(HOOK)
    user_data = "#cloud-config\nwrite_files: [{path: /etc/lab-test, content: booted}]\n"
    docs.insert(0, {"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                    "metadata": {"name": "lab-compute", "namespace": "metal3"}, "data": {"value": b64(user_data)}})
    mgmt.create_all(api, mgmt.cluster_kubeconfig_secrets(server, docs) + docs)
    fake = tmp_path / "machines.py"
    fake.write_text(FAKE_MACHINES)
    log = tmp_path / "machines.py.log"
    agent = hostagent.Agent(api, "metal3", str(tmp_path / "agent"), "python3 %s" % fake, deprovision_seconds=8)
    os.makedirs(str(tmp_path / "agent"))
    stopped = []
    thread = threading.Thread(target=agent.run, args=(stopped, 0.5), daemon=True)
    thread.start()

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    try:
        (machine,) = wait_for("the Machine Provisioned", lambda: provisioned_machines(api, "metal3", 1), controllers)
        boots = wait_for("the host agent's boot", lambda: [c for c in calls() if c["args"][0] == "machine-boot"],
                         controllers, timeout=60)
        (boot,) = boots
        host = boot["args"][1]
        assert boot["args"] == ["machine-boot", host, dict((h[0], h[1]) for h in hosts)[host], "compute", boot["args"][4]]
        assert boot["user_data"] == user_data
        assert machine["metadata"]["name"].startswith("lab-compute-")
        assert {"type": "Hostname", "address": host} in machine["status"]["addresses"]
        assert {"type": "InternalIP", "address": boot["args"][2]} in machine["status"]["addresses"]
        time.sleep(3)
        assert len([c for c in calls() if c["args"][0] == "machine-boot"]) == 1  # booted once, not again

        api.patch(CAPI, "machinedeployments", "metal3", "lab-compute", {"spec": {"replicas": 0}}, sub="scale")
        wait_for("the host agent's removal", lambda: ["machine-remove", host] in [c["args"] for c in calls()],
                 controllers)
        removed = time.monotonic()
        paused = wait_for("the host given back held", lambda: (api.get(BMH, "baremetalhosts", "metal3", host)
                          ["metadata"].get("annotations") or {}).get(hostagent.PAUSED), controllers, timeout=30)
        assert paused == hostagent.PAUSED_BY
        wait_for("the hold released", lambda: hostagent.PAUSED not in (api.get(
            BMH, "baremetalhosts", "metal3", host)["metadata"].get("annotations") or {}), controllers, timeout=30)
        assert time.monotonic() - removed >= 6
        wait_for("the host available", lambda: host_states(api, "metal3")[host] == "available", controllers)
    finally:
        stopped.append(True)
        thread.join(10)


def test_a_kubernetes_worker_is_followed_and_drained_by_cluster_api(management, tmp_path):
    """The shared pool's Kubernetes workers on the real controllers (lab/capi_objects.py --kubernetes-gpu,
    lab/mgmt.py --workload, lab/hostagent.py --workload): the workload cluster has its own kube-apiserver; the
    host agent, as the host's kubelet, registers its Node once the host CAPM3 claimed has booted (the host's
    GPUs as capacity, the providerID CAPM3 gave), and Cluster API - not us - sets the Machine's nodeRef and
    phase Running. Scaled to 0, Cluster API drains the Node (cordon, then evicts the Pod running there, which
    the kubelet stand-in removes once it is being deleted), the host is deprovisioned, and Cluster API
    deletes the Node."""
    import capi_objects
    import hostagent
    import mgmt
    server, controllers = management
    api = server.api()
    workload = kubeapi.KubeApiServer(str(tmp_path / "workload"), crds=None).start()
    try:
        wapi = workload.api()
        wapi.ok("POST", "/api/v1/namespaces/default/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        docs = capi_objects.real_pool_hosts("wl", 1, 1, "10.89.98", 4, 8000, kubernetes_gpu=1)
        docs += capi_objects.real_kubernetes_objects("wl", 1, 6443, "10.89.98.4")
        assert [d["metadata"]["labels"] for d in docs if d["kind"] == "BareMetalHost"] == [
            {"gpu": "true", "nvidia.com/gpu.count": "2", "converged.hpc/pool": "wl-k8s-gpu"},
            {"converged.hpc/pool": "wl-k8s-cp"}]
        kubeconfig = workload.kubeconfig(str(tmp_path / "workload.kubeconfig"), context="wl-k8s")
        mgmt.create_all(api, mgmt.cluster_kubeconfig_secrets(server, docs, {"wl-k8s": kubeconfig}) + docs)
        fake = tmp_path / "machines.py"
        fake.write_text(FAKE_MACHINES)
        os.makedirs(str(tmp_path / "agent"))
        agent = hostagent.Agent(api, "metal3", str(tmp_path / "agent"), "python3 %s" % fake,
                                workloads={"wl-k8s": wapi})
        stopped = []
        thread = threading.Thread(target=agent.run, args=(stopped, 0.5), daemon=True)
        thread.start()
        try:
            workers = "cluster.x-k8s.io/deployment-name=wl-k8s-gpu"

            def running():
                items = api.list(CAPI, "machines", "metal3", labelSelector=workers)
                return items if len(items) == 1 and (items[0].get("status") or {}).get("phase") == "Running" \
                    else None
            (machine,) = wait_for("the worker's Machine Running", running, controllers)
            # the control plane Machine, on its host, Running too: its Node registered as well
            wait_for("the control plane Machine Running", lambda: (api.get(CAPI, "machines", "metal3", "wl-k8s-cp")
                     .get("status") or {}).get("phase") == "Running", controllers)
            assert machine["status"]["nodeRef"]["name"] == "wl-bm-01"
            node = wapi.get("v1", "nodes", None, "wl-bm-01")
            host = api.get(BMH, "baremetalhosts", "metal3", "wl-bm-01")
            assert node["spec"]["providerID"] == machine["spec"]["providerID"]
            assert machine["spec"]["providerID"].startswith("metal3://metal3/wl-bm-01/")
            assert node["metadata"]["labels"]["metal3.io/uuid"] == host["metadata"]["uid"]
            assert node["status"]["capacity"]["nvidia.com/gpu"] == "2" and node["status"]["capacity"]["cpu"] == "4"
            # Cluster API's own touch on the Node it follows: its annotations name the Machine
            wait_for("Cluster API's annotations on the Node", lambda: (wapi.get("v1", "nodes", None, "wl-bm-01")[
                "metadata"].get("annotations") or {}).get("cluster.x-k8s.io/machine") == machine["metadata"]["name"],
                controllers, timeout=60)

            wapi.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "default"},
                         "spec": {"nodeName": "wl-bm-01", "automountServiceAccountToken": False,
                                  "containers": [{"name": "train", "image": "registry.invalid/cuda:12",
                                                  "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
            wait_for("the Pod running", lambda: (wapi.get("v1", "pods", "default", "train").get("status") or {})
                     .get("phase") == "Running", controllers, timeout=30)

            api.patch(CAPI, "machinedeployments", "metal3", "wl-k8s-gpu", {"spec": {"replicas": 0}}, sub="scale")
            wait_for("the Node cordoned by Cluster API", lambda: (wapi.get("v1", "nodes", None, "wl-bm-01").get(
                "spec") or {}).get("unschedulable"), controllers, timeout=120)
            wait_for("the Pod evicted and gone", lambda: wapi.get("v1", "pods", "default", "train") is None,
                     controllers, timeout=120)
            wait_for("the Machine gone", lambda: not api.list(CAPI, "machines", "metal3", labelSelector=workers),
                     controllers)
            wait_for("the Node deleted by Cluster API", lambda: wapi.get("v1", "nodes", None, "wl-bm-01") is None,
                     controllers, timeout=60)
            wait_for("the host available again", lambda: host_states(api, "metal3").get("wl-bm-01") == "available",
                     controllers)
        finally:
            stopped.append(True)
            thread.join(10)
    finally:
        workload.stop()
