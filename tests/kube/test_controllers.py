"""The real servers `make kube-assets` builds, working together: kube-apiserver and etcd, the Cluster API
core manager, CAPM3 and the Bare Metal Operator in its test mode, on loopback, with the CRDs of the
controllers' own module versions.

What a site's management cluster does with bare metal, end to end and judged only by the controllers:
BareMetalHosts registered with BMC credentials go to available; a MachineDeployment of 2 whose
Metal3MachineTemplate selects hosts by label claims two of them (not the one the selector leaves out),
its Machines reach Provisioned with the providerID CAPM3 gives; scaled to 0 it gives both hosts back,
deprovisioned to available, and its Machines and Metal3Machines are gone.
"""

import base64
import os
import time

import pytest
import yaml

import kubeapi

CAPI = "cluster.x-k8s.io/v1beta2"
INFRA = "infrastructure.cluster.x-k8s.io/v1beta2"
BMH = "metal3.io/v1alpha1"
NS = "smoke"
CLUSTER = "smoke"
MD = "smoke-workers"
POOL_LABEL = "converged.hpc/smoke-pool"

ASSETS, _ = kubeapi.assets()
MISSING = [b for b in kubeapi.Controllers.BINARIES if not (ASSETS and os.access(os.path.join(ASSETS, b), os.X_OK))]
pytestmark = pytest.mark.skipif(bool(MISSING), reason="no %s in $KUBEBUILDER_ASSETS (make kube-assets builds them)"
                                % ", ".join(MISSING))


@pytest.fixture(scope="module")
def management(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("management")
    server = kubeapi.KubeApiServer(str(workdir / "apiserver"), crds=kubeapi.module_crds())
    server.start()
    controllers = kubeapi.Controllers(server, str(workdir / "controllers"))
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


def host_states(api):
    return {h["metadata"]["name"]: ((h.get("status") or {}).get("provisioning") or {}).get("state")
            for h in api.list(BMH, "baremetalhosts", NS)}


def test_hosts_claimed_provisioned_and_given_back(management):
    server, controllers = management
    api = server.api()
    api.namespace(NS)
    # ---- what a site writes: BMC credentials and its hosts (two in the pool, one outside it)
    api.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "smoke-bmc", "namespace": NS},
                "data": {"username": b64("admin"), "password": b64("not-a-real-bmc")}})
    hosts = {"smoke-host-0": "pool", "smoke-host-1": "pool", "smoke-host-2": "elsewhere"}
    for i, (name, pool) in enumerate(sorted(hosts.items())):
        api.create({"apiVersion": BMH, "kind": "BareMetalHost",
                    "metadata": {"name": name, "namespace": NS, "labels": {POOL_LABEL: pool}},
                    "spec": {"online": True, "bootMACAddress": "52:54:00:5e:00:%02x" % i,
                             "bmc": {"address": "ipmi://127.0.0.1:%d" % (6230 + i), "credentialsName": "smoke-bmc"}}})
    wait_for("the three hosts available", lambda: set(host_states(api).values()) == {"available"}, controllers)

    # ---- the cluster: Cluster, Metal3Cluster, the kubeconfig Secret the controllers reach it through
    kubeconfig = server.kubeconfig(os.path.join(controllers.workdir, "workload.kubeconfig"), context=CLUSTER)
    with open(kubeconfig) as fh:
        api.create({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                    "metadata": {"name": CLUSTER + "-kubeconfig", "namespace": NS,
                                 "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
                    "data": {"value": b64(fh.read())}})
    api.create({"apiVersion": INFRA, "kind": "Metal3Cluster", "metadata": {"name": CLUSTER, "namespace": NS},
                "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443}}})
    api.create({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": CLUSTER, "namespace": NS},
                "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Cluster",
                                               "name": CLUSTER}}})
    # ---- the workers: bootstrap data, a template selecting the pool's hosts, a MachineDeployment of 2
    api.create({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                "metadata": {"name": "smoke-bootstrap", "namespace": NS,
                             "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
                "data": {"value": b64("#cloud-config\nruncmd: [[true]]\n"), "format": b64("cloud-config")}})
    api.create({"apiVersion": INFRA, "kind": "Metal3MachineTemplate", "metadata": {"name": MD, "namespace": NS},
                "spec": {"template": {"spec": {
                    "image": {"url": "http://127.0.0.1:8080/debian.qcow2", "checksumType": "sha256",
                              "checksum": "0" * 64, "diskFormat": "qcow2"},
                    "hostSelector": {"matchLabels": {POOL_LABEL: "pool"}}}}}})
    labels = {"cluster.x-k8s.io/cluster-name": CLUSTER, "cluster.x-k8s.io/deployment-name": MD}
    api.create({"apiVersion": CAPI, "kind": "MachineDeployment",
                "metadata": {"name": MD, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER}},
                "spec": {"clusterName": CLUSTER, "replicas": 2, "selector": {"matchLabels": labels},
                         # what Cluster API's defaulting webhook would write (none is installed here)
                         "rollout": {"strategy": {"type": "RollingUpdate",
                                                  "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                         "template": {"metadata": {"labels": labels}, "spec": {
                             "clusterName": CLUSTER, "bootstrap": {"dataSecretName": "smoke-bootstrap"},
                             "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                   "kind": "Metal3MachineTemplate", "name": MD}}}}})

    def provisioned():
        machines = api.list(CAPI, "machines", NS)
        done = [m for m in machines if (m.get("status") or {}).get("phase") == "Provisioned"]
        return machines if len(machines) == 2 and len(done) == 2 else None

    machines = wait_for("two Machines Provisioned", provisioned, controllers)
    states = host_states(api)
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
        assert bmh["spec"]["userData"]["name"] == "smoke-bootstrap"
        assert bmh["spec"]["image"]["url"] == "http://127.0.0.1:8080/debian.qcow2"
    assert sorted(claimed) == ["smoke-host-0", "smoke-host-1"]

    # ---- scaled to 0 through /scale: the Machines go, the hosts are deprovisioned and available again
    api.patch(CAPI, "machinedeployments", NS, MD, {"spec": {"replicas": 0}}, sub="scale")
    wait_for("the Machines and Metal3Machines gone",
             lambda: not api.list(CAPI, "machines", NS) and not api.list(INFRA, "metal3machines", NS), controllers)
    wait_for("both hosts available again", lambda: set(host_states(api).values()) == {"available"}, controllers)
    for host in claimed:
        assert not api.get(BMH, "baremetalhosts", NS, host)["spec"].get("consumerRef")


def test_versions_are_the_pinned_ones(management):
    """The binaries are the versions kube-assets/*/go.mod pin: kube-apiserver says its own (stamped at
    build), the server reports it, and the versions file names each module."""
    server, _ = management
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
