"""Write what a site writes in its management cluster for the lab's machines, for the real Cluster API,
CAPM3 and Bare Metal Operator (lab/mgmt.py applies it): nothing a controller would write.

Input: the lab's machines.tsv (name, address, node type[, spare]). Output: one YAML stream with the
Cluster and Metal3Cluster, per node type a MachineDeployment (its template's labels carry node-type, its
annotations our hook and a GPU's GRES) and a Metal3MachineTemplate selecting its pool's hosts, and per
machine a registered host (a BareMetalHost and its BMC Secret, the hardware given by annotation). The
controllers create the Machines, claim the hosts and provision them; lab/hostagent.py boots each one.
A compute MachineDeployment is always there, at 0 replicas when the lab has no compute machine (the
autoscaler grows it, docs/autoscale.md).

    lab/capi_objects.py MACHINES_TSV OUT_YAML --cluster lab --cpus 2 --ram-mib 2000 [--spares-out SPARES_YAML]

With --bare-metal N the compute and GPU machines come from a pool of N hosts (<cluster>-bm-NN at
<subnet>.101...), the first --bare-metal-gpu of them labelled gpu=true; the compute and gpu
MachineDeployments' templates select by that label and by side (converged.hpc/pool), and start with
--replicas compute=N,gpu=N: CAPM3 chooses among the hosts they match. --kubernetes-gpu K adds the
Kubernetes workload cluster <cluster>-k8s on the same pool: its control plane Machine on a host of its own
and a MachineDeployment of K GPU workers.

With --clusters N > 1 the machines are dealt in turn into N Cluster API clusters
named <cluster>-1 ... <cluster>-N (the first controller to the first cluster, the
second to the second...), each with its own MachineDeployments.
"""

import argparse
import base64
import hashlib
import json
import os

import yaml

from machines import GPU_GRES, ram_of

NS = "metal3"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
GRES = "slurm.converged.hpc/gres"
# the lab's compute-role node types (lab/group_vars.yml): their templates carry our hook
COMPUTE_TYPES = ("compute", "gpu", "highmem")


def template_annotations(node_type):
    """What the MachineDeployment's template gives every new Machine: our hook on Slurm nodes,
    the GRES annotation on GPU machines (Cluster API copies template annotations to Machines)."""
    out = {HOOK: "converged-hpc"} if node_type in COMPUTE_TYPES else {}
    if node_type == "gpu":
        out[GRES] = GPU_GRES
    return out


def mac(name):
    digest = hashlib.sha256(name.encode()).hexdigest()
    return "02:" + ":".join(digest[i:i + 2] for i in range(0, 10, 2))


# node types whose machines come from the bare-metal pool (--bare-metal), and what their templates select:
# the host's side (the label a move changes, docs/converged.md) and its hardware
POOL_LABEL_KEY = "converged.hpc/pool"
BARE_METAL_SELECTORS = {
    "compute": {"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["true"]}]},
    "gpu": {"matchLabels": {"gpu": "true"}},
}


def bare_metal_selector(cluster, node_type):
    selector = dict(BARE_METAL_SELECTORS[node_type])
    side = {POOL_LABEL_KEY: "%s-%s" % (cluster, node_type)}
    selector["matchLabels"] = dict(selector.get("matchLabels") or {}, **side)
    return selector


def metal3_template(name, selector, image):
    return {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3MachineTemplate",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"template": {"spec": {
                "hostSelector": selector, "automatedCleaningMode": "metadata",
                "image": {"url": "http://images.lab.invalid/%s.qcow2" % image,
                          "checksum": "http://images.lab.invalid/%s.qcow2.sha256sum" % image,
                          "checksumType": "sha256", "diskFormat": "qcow2"}}}}}


KUBERNETES_NODE_TYPE = "kubernetes"
# node types with a MachineDeployment even when the lab has no machine of them: compute, at 0 replicas
# when the lab has none (the autoscaler grows it, docs/autoscale.md)
ALWAYS = ("compute",)


# ---- the objects a site writes for the controllers: nothing a controller would write
IMAGES = "http://images.lab.invalid"
INSPECT = "inspect.metal3.io"
HARDWARE_DETAILS = "inspect.metal3.io/hardwaredetails"


def real_host(cluster, name, address, node_type, cpus, ram_mib, index, labels=None):
    """A registered host: its BMC credentials Secret and its BareMetalHost, labelled for the pool of its
    node type (<cluster>-<type>, what its MachineDeployment's template selects; or labels as given), with
    the hardware a site gives when it does not inspect (inspection disabled, the hardware details
    annotation): the lab machine's address and name, the CPUs and RAM the lab declares."""
    secret = name + "-bmc"
    if labels is None:
        labels = {POOL_LABEL_KEY: "%s-%s" % (cluster, node_type)}
        if node_type == "gpu":
            labels.update({"gpu": "true", "nvidia.com/gpu.count": "2"})
    details = {"cpu": {"arch": "x86_64", "count": cpus, "model": "lab", "clockMegahertz": 2000},
               "ramMebibytes": ram_of(node_type, ram_mib), "hostname": name,
               "nics": [{"name": "eth0", "ip": address, "mac": mac(name), "speedGbps": 10}],
               "storage": [{"name": "/dev/vda", "sizeBytes": 64 * 1024 ** 3, "rotational": False}],
               "systemVendor": {"manufacturer": "converged.hpc lab", "productName": "podman machine"},
               "firmware": {"bios": {"vendor": "lab", "version": "1"}}}
    return [
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": {"name": secret, "namespace": NS},
         "data": {"username": base64.b64encode(b"lab").decode(),
                  "password": base64.b64encode(hashlib.sha256(name.encode()).hexdigest()[:16].encode()).decode()}},
        {"apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
         "metadata": {"name": name, "namespace": NS, "labels": labels,
                      "annotations": {INSPECT: "disabled", HARDWARE_DETAILS: json.dumps(details)}},
         "spec": {"online": False, "bootMACAddress": mac(name), "automatedCleaningMode": "metadata",
                  "bmc": {"address": "ipmi://127.0.0.1:%d" % (6230 + index), "credentialsName": secret}}}]


def real_cluster(cluster, api_port):
    return [{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Cluster",
             "metadata": {"name": cluster, "namespace": NS},
             "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": api_port}}},
            {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
             "metadata": {"name": cluster, "namespace": NS},
             "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                            "kind": "Metal3Cluster", "name": cluster}}}]


def real_deployment(cluster, md, node_type, replicas, host_selector):
    """A MachineDeployment of node_type and its Metal3MachineTemplate (the image <node type>.qcow2, which the
    host agent boots as that node type), claiming the hosts host_selector selects."""
    selector = {"cluster.x-k8s.io/cluster-name": cluster, "cluster.x-k8s.io/deployment-name": md}
    template = metal3_template(md, host_selector, node_type)
    template["spec"]["template"]["spec"]["image"]["url"] = "%s/%s.qcow2" % (IMAGES, node_type)
    deployment = {
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": md, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {"clusterName": cluster, "replicas": replicas, "selector": {"matchLabels": selector},
                 # what Cluster API's defaulting webhook writes (a site's has one; the lab installs none)
                 "rollout": {"strategy": {"type": "RollingUpdate",
                                          "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}},
                 "template": {"metadata": {"labels": dict(selector, **{"node-type": node_type}),
                                           "annotations": template_annotations(node_type)},
                              "spec": {"clusterName": cluster, "version": "v1.33.4",
                                       "bootstrap": {"dataSecretName": md},
                                       "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                                             "kind": "Metal3MachineTemplate", "name": md}}}}}
    return [deployment, template]


def real_objects(machines, cluster, cpus, ram_mib, api_port, pool=None):
    """Cluster, Metal3Cluster, and per node type a MachineDeployment (replicas: its machines) and a
    Metal3MachineTemplate selecting its pool's hosts. machines: (name, address, node type) of this
    cluster's first machines. pool: {node type: replicas} of the node types whose hosts come from the
    bare-metal pool (real_pool_objects: the template selects by hardware and side)."""
    del cpus, ram_mib  # (the hosts carry the hardware)
    pool = pool or {}
    docs = real_cluster(cluster, api_port)
    for node_type in sorted({m[2] for m in machines} | set(ALWAYS) | set(pool)):
        md = "%s-%s" % (cluster, node_type)
        if node_type in pool:
            docs.extend(real_deployment(cluster, md, node_type, pool[node_type],
                                        bare_metal_selector(cluster, node_type)))
        else:
            docs.extend(real_deployment(cluster, md, node_type, len([m for m in machines if m[2] == node_type]),
                                        {"matchLabels": {POOL_LABEL_KEY: md}}))
    return docs


def real_pool_hosts(cluster, count, gpu, subnet, cpus, ram_mib, kubernetes_gpu=0):
    """The bare-metal pool as a site registers it: <cluster>-bm-NN at <subnet>.(100+N), the first gpu of them
    labelled gpu=true with 2 GPUs (as GPU feature discovery labels them), each labelled with the side it
    starts on (converged.hpc/pool): the last kubernetes_gpu GPU hosts the Kubernetes workers', the other
    GPU hosts Slurm's gpu node type's, the rest compute's."""
    docs = []
    for index in range(1, count + 1):
        name = "%s-bm-%02d" % (cluster, index)
        side = cluster + ("-k8s-gpu" if gpu - kubernetes_gpu < index <= gpu else "-gpu")
        labels = {"gpu": "true", "nvidia.com/gpu.count": "2", POOL_LABEL_KEY: side} if index <= gpu \
            else {POOL_LABEL_KEY: cluster + "-compute"}
        docs.extend(real_host(cluster, name, "%s.%d" % (subnet, 100 + index), "gpu" if index <= gpu else "compute",
                              cpus, ram_mib, 100 + index, labels))
    return docs


def real_kubernetes_objects(cluster, replicas, api_port, control_plane_address, cpus=2, ram_mib=2000):
    """The Kubernetes workload cluster on the same pool (<cluster>-k8s, its own Cluster; the kubeconfig
    Secret the controllers reach its API through is lab/mgmt.py's --workload): its control plane node (a
    Machine labelled cluster.x-k8s.io/control-plane on a host of its own, <cluster>-k8s-cp at
    control_plane_address: Cluster API drains a worker's Node, and deletes it, only while its cluster has a
    control plane Machine) and its GPU workers (<cluster>-k8s-gpu, node type kubernetes: no hook, no Slurm),
    claiming the GPU hosts on their side."""
    name, md, cp = cluster + "-k8s", cluster + "-k8s-gpu", cluster + "-k8s-cp"
    side = {POOL_LABEL_KEY: cp}
    template = metal3_template(cp, {"matchLabels": side}, KUBERNETES_NODE_TYPE)["spec"]["template"]["spec"]
    template["image"]["url"] = "%s/%s.qcow2" % (IMAGES, KUBERNETES_NODE_TYPE)
    labels = {"cluster.x-k8s.io/cluster-name": name, "cluster.x-k8s.io/control-plane": "",
              "node-type": KUBERNETES_NODE_TYPE}
    control_plane = real_host(name, cp, control_plane_address, KUBERNETES_NODE_TYPE, cpus, ram_mib, 99, side) + [
        {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3Machine",
         "metadata": {"name": cp, "namespace": NS, "labels": {"cluster.x-k8s.io/cluster-name": name}},
         "spec": template},
        {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
         "metadata": {"name": cp, "namespace": NS, "labels": labels},
         "spec": {"clusterName": name, "version": "v1.33.4", "bootstrap": {"dataSecretName": cp},
                  "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine",
                                        "name": cp}}}]
    return real_cluster(name, api_port) + control_plane + real_deployment(
        name, md, KUBERNETES_NODE_TYPE, replicas, {"matchLabels": {"gpu": "true", POOL_LABEL_KEY: md}})


def write_stream(path, docs):
    with open(path, "w") as fh:
        os.chmod(path, 0o600)
        yaml.safe_dump_all(docs, fh, sort_keys=False)


def real_main(args, machines):
    """What a site writes for the controllers. The hosts of machines.tsv's 4th column
    'spare' are registered later (--spares-out): the first Machines claim exactly the lab's first
    machines, and scale-ups find hosts to claim."""
    clusters = [args.cluster] if args.clusters == 1 else ["%s-%d" % (args.cluster, i + 1)
                                                          for i in range(args.clusters)]
    docs, spares = [], []
    for index, cluster in enumerate(clusters):
        share = []
        for node_type in sorted({m[2] for m in machines}):
            share.extend([m for m in machines if m[2] == node_type][index::len(clusters)])
        first = [m[:3] for m in share if len(m) < 4 or m[3] != "spare"]
        pool = {}
        if args.bare_metal:
            pool = {t: 0 for t in BARE_METAL_SELECTORS}
            pool.update({k: int(v) for k, v in (p.split("=") for p in args.replicas.split(",") if p)})
        docs.extend(real_objects(first, cluster, args.cpus, args.ram_mib, args.api_port, pool))
        if args.bare_metal:
            docs.extend(real_pool_hosts(cluster, args.bare_metal, args.bare_metal_gpu, args.subnet, args.cpus,
                                        args.ram_mib, args.kubernetes_gpu))
            if args.kubernetes_gpu:
                docs.extend(real_kubernetes_objects(cluster, args.kubernetes_gpu, args.api_port,
                                                    "%s.4" % args.subnet, args.cpus, args.ram_mib))
        for name, address, node_type, *rest in share:
            host = real_host(cluster, name, address, node_type, args.cpus, args.ram_mib, machines.index(
                next(m for m in machines if m[0] == name)))
            (spares if rest and rest[0] == "spare" else docs).extend(host)
    for path, option in ((args.munge_key_file, "munge-key"), (args.slurmdbd_password_file, "slurmdbd")):
        if path:
            with open(path, "rb") as fh:
                data = {"munge.key": base64.b64encode(fh.read()).decode()} if option == "munge-key" \
                    else {"password": base64.b64encode(fh.read().strip()).decode()}
            docs.insert(0, {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                            "metadata": {"name": option, "namespace": NS}, "data": data})
    write_stream(args.out, docs)
    if args.spares_out:
        write_stream(args.spares_out, spares)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("machines")
    ap.add_argument("out")
    ap.add_argument("--cluster", default="lab")
    ap.add_argument("--clusters", type=int, default=1, help="deal the machines into this many clusters")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--ram-mib", type=int, default=2000)
    ap.add_argument("--bare-metal", type=int, default=0, help="register this many BareMetalHosts (a pool)")
    ap.add_argument("--bare-metal-gpu", type=int, default=0, help="how many of them are labelled gpu=true")
    ap.add_argument("--subnet", default="10.89.50", help="the lab network's first three octets")
    ap.add_argument("--replicas", default="", help="compute=N,gpu=N: the pool's MachineDeployments' replicas")
    ap.add_argument("--kubernetes-gpu", type=int, default=0,
                    help="a Kubernetes workload cluster <cluster>-k8s with this many GPU workers from the pool")
    ap.add_argument("--munge-key-file", help="also serve this munge key as Secret metal3/munge-key")
    ap.add_argument("--slurmdbd-password-file",
                    help="also serve this password as Secret metal3/slurmdbd (key password)")
    ap.add_argument("--spares-out", help="the spare hosts (machines.tsv's 'spare' lines) go here")
    ap.add_argument("--api-port", type=int, default=16443, help="the management cluster's port")
    args = ap.parse_args()
    with open(args.machines) as fh:
        machines = [tuple(line.split()) for line in fh if line.strip()]
    real_main(args, machines)


if __name__ == "__main__":
    main()
