"""join_at_boot_plan and join_at_boot_fstab: which MachineDeployments join Slurm at first boot, and the
fstab lines their bootstrap data writes."""

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.join_at_boot import join_at_boot_fstab, join_at_boot_plan

HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
NODE_TYPES = {"controller": {"role": "controller"},
              "compute": {"role": "compute", "nodeset": "computeset", "partitions": ["compute"]},
              "gpu": {"role": "compute", "nodeset": "gpuset", "partitions": ["gpu"], "gres": "gpu:a100:4"}}


def md(name, node_type, annotations=None, labels=None, secret=None):
    template_labels = {"node-type": node_type} if node_type else {}
    template_labels.update(labels or {})
    spec = {"template": {"metadata": {"labels": template_labels,
                                      "annotations": {HOOK: "converged-hpc"} if annotations is None else annotations},
                         "spec": {"bootstrap": {"dataSecretName": secret or name}}}}
    return {"metadata": {"name": name, "namespace": "metal3"}, "spec": spec}


def plan(deployments, requested, **kwargs):
    return join_at_boot_plan(deployments, requested, NODE_TYPES, HOOK, **kwargs)


def test_a_compute_deployment_with_the_hook_joins_with_its_features_and_secret():
    out = plan([md("hpc-compute", "compute", labels={"feature.slurm.converged.hpc/ib": "true",
                                                     "feature.slurm.converged.hpc/old": "false"}),
                md("hpc-controller", "controller")], ["hpc-compute"])
    assert out == {"errors": [], "deployments": [{
        "name": "hpc-compute", "namespace": "metal3", "node_type": "compute", "features": ["compute", "ib"],
        "secret": "hpc-compute-join", "named": False, "gres": "", "devices": []}]}


def test_gpu_nodes_join_at_boot_when_their_hosts_are_named_ahead_or_slurmd_finds_the_devices():
    ahead = dict(NODE_TYPES, gpu=dict(NODE_TYPES["gpu"], gres_nodes="bm-[01-04]"))
    devices = {"gpu": "/dev/nvidia"}
    out = join_at_boot_plan([md("hpc-gpu", "gpu")], ["hpc-gpu"], ahead, HOOK, gres_devices=devices)
    assert out["errors"] == [] and out["deployments"][0]["gres"] == "gpu:a100:4"
    # the boot checks the device files gres.conf names before slurmd starts
    assert out["deployments"][0]["devices"] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"]
    # slurmd finds them (NVML): no names needed, no files to check
    out = plan([md("hpc-gpu", "gpu")], ["hpc-gpu"], gres_devices=devices, gres_autodetect="nvml")
    assert out["errors"] == [] and out["deployments"][0]["devices"] == []
    # named ahead with the node type's GRES, but the template declares others: those lines would be wrong
    other = md("hpc-gpu", "gpu", annotations={HOOK: "converged-hpc", "slurm.converged.hpc/gres": "gpu:a100:8"})
    out = join_at_boot_plan([other], ["hpc-gpu"], ahead, HOOK, gres_devices=devices)
    assert out["deployments"] == [] and "with the node type's gres, not the template's gpu:a100:8" in out["errors"][0]
    # autodetect finds devices, not a GRES counted only (no device prefix): such a GRES needs its hosts named
    out = plan([md("hpc-x", "compute", annotations={HOOK: "converged-hpc", "slurm.converged.hpc/gres": "nvme:1"})],
               ["hpc-x"], gres_devices=devices, gres_autodetect="nvml")
    assert out["deployments"] == [] and "name the hosts ahead (converged_node_types.compute.gres_nodes" in out["errors"][0]


def test_a_template_that_names_the_secret_already_is_said_so():
    out = plan([md("hpc-compute", "compute", secret="hpc-compute-join")], ["hpc-compute"])
    assert out["deployments"][0]["named"] is True


def test_nothing_requested_is_nothing_to_do():
    assert plan([md("hpc-compute", "compute")], []) == {"errors": [], "deployments": []}


@pytest.mark.parametrize("deployments, requested, kwargs, message", [
    ([md("hpc-compute", "compute")], ["hpc-nope"], {},
     "converged_join_at_boot names MachineDeployment hpc-nope, which the cluster does not have (it has: hpc-compute)"),
    ([md("hpc-controller", "controller")], ["hpc-controller"], {},
     "MachineDeployment metal3/hpc-controller: its Machines are node type controller, which feeds no Slurm nodeset"),
    ([md("hpc-x", None)], ["hpc-x"], {},
     "MachineDeployment metal3/hpc-x: its Machines are node type (no node-type label in its template)"),
    ([md("hpc-compute", "compute", annotations={})], ["hpc-compute"], {},
     "MachineDeployment metal3/hpc-compute: its template does not carry our deletion hook (annotation %s)" % HOOK),
    ([md("hpc-gpu", "gpu")], ["hpc-gpu"], {},
     "MachineDeployment metal3/hpc-gpu: its nodes declare GRES (gpu:a100:4)"),
    ([md("hpc-compute", "compute", annotations={HOOK: "converged-hpc", "slurm.converged.hpc/gres": "gpu:2"})],
     ["hpc-compute"], {}, "its nodes declare GRES (gpu:2)"),
    ([md("hpc-compute", "compute")], ["hpc-compute"],
     {"secrets": [{"metadata": {"name": "hpc-compute-join", "labels": {"app": "kubeadm"}}}]},
     "Secret hpc-compute-join exists and converged.hpc did not write it"),
    ([md("hpc-compute", "compute")], [{"name": "hpc-compute"}], {},
     "converged_join_at_boot: {'name': 'hpc-compute'} is not a MachineDeployment name"),
])
def test_what_cannot_join_at_boot_is_refused_naming_it(deployments, requested, kwargs, message):
    out = plan(deployments, requested, **kwargs)
    assert out["deployments"] == []
    assert any(message in error for error in out["errors"]), out["errors"]


def test_every_reason_is_named_at_once():
    out = plan([md("hpc-gpu", "gpu", annotations={})], ["hpc-gpu", "hpc-nope"])
    assert len(out["errors"]) == 3, out["errors"]


def test_our_own_secret_is_written_again():
    out = plan([md("hpc-compute", "compute")], ["hpc-compute"], secrets=[{"metadata": {
        "name": "hpc-compute-join", "labels": {"app.kubernetes.io/managed-by": "converged.hpc"}}}])
    assert out["errors"] == [] and out["deployments"][0]["secret"] == "hpc-compute-join"


def test_requested_must_be_a_list():
    with pytest.raises(AnsibleFilterError, match="converged_join_at_boot must be a list"):
        plan([], "hpc-compute")


def test_fstab_lines_are_what_ansible_posix_mount_writes():
    assert join_at_boot_fstab([{"src": "/srv/home", "path": "/home", "opts": ["rw", "hard", "vers=4.2"]},
                               {"src": "/srv/my data", "path": "/data"}], "10.0.0.1") == [
        {"path": "/home", "line": "10.0.0.1:/srv/home /home nfs rw,hard,vers=4.2 0 0"},
        {"path": "/data", "line": "10.0.0.1:/srv/my\\040data /data nfs rw,hard,_netdev 0 0"}]


def test_a_mount_without_a_path_is_refused():
    with pytest.raises(AnsibleFilterError, match="is not a mount with src and path"):
        join_at_boot_fstab([{"src": "/srv/home"}], "10.0.0.1")
