"""The pure mapping from recorded Cluster API / Metal3 objects to hosts and groups."""

import copy
import re

import pytest

from conftest import objects_by_kind
from ansible_collections.converged.hpc.plugins.module_utils.capi_mapping import (
    MACHINE_SPEC,
    LEAN_KEYS,
    MACHINE_STATUS,
    MappingOptions,
    build,
    merge,
    pages_map_alone,
    sanitize_group,
    trim,
)


def recorded(name="capi-hpc.yaml", metal3=True):
    kinds = objects_by_kind(name)
    return {"machines": kinds.get("Machine", []),
            "metal3machines": kinds.get("Metal3Machine", []) if metal3 else [],
            "baremetalhosts": kinds.get("BareMetalHost", []) if metal3 else []}


def v1beta2_with_metal3():
    return recorded()


def test_groups_by_node_type_cluster_and_deployment():
    inv = build(v1beta2_with_metal3(), MappingOptions())
    assert sorted(inv.groups["controller"]) == ["hpc-controller-5c6b9-q8m4n", "hpc-controller-5c6b9-x7k2p"]
    assert sorted(inv.groups["compute"]) == ["edge-workers-6f5d4-m2wq7", "edge-workers-6f5d4-r8t3k",
                                             "hpc-compute-7d9f8-abcde", "hpc-compute-7d9f8-fghij"]
    assert "hpc-compute-7d9f8-abcde" in inv.groups["capi_cluster_hpc"]
    assert sorted(inv.groups["capi_cluster_edge"]) == ["edge-workers-6f5d4-m2wq7", "edge-workers-6f5d4-r8t3k"]
    assert "hpc-controller-5c6b9-x7k2p" in inv.groups["capi_md_hpc_controller"]


def test_deleting_machine_only_in_deleting_group():
    inv = build(v1beta2_with_metal3(), MappingOptions(hostvars="full"))
    host = "hpc-compute-7d9f8-pqrst"
    assert inv.groups["capi_deleting"] == [host]
    assert host not in inv.groups["compute"]
    data = inv.hosts[host]["capi"]
    assert data["deleting"] is True and data["deletion_timestamp"]
    assert "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slurm" in data["annotations"]


def test_deleting_excluded_when_asked():
    inv = build(v1beta2_with_metal3(), MappingOptions(include_deleting=False))
    assert "hpc-compute-7d9f8-pqrst" not in inv.hosts
    assert "capi_deleting" not in inv.groups


def test_provisioning_machine_without_address_is_left_out_quietly():
    inv = build(v1beta2_with_metal3(), MappingOptions())
    assert inv.skipped["metal3/hpc-compute-7d9f8-klmno"] == "phase Provisioning"
    assert not any("klmno" in w for w in inv.warnings)


def test_missing_node_type_label_warns_with_machine_name():
    inv = build(v1beta2_with_metal3(), MappingOptions())
    assert "hpc-compute-7d9f8-uvwxy" not in inv.hosts
    assert any("metal3/hpc-compute-7d9f8-uvwxy" in w and "node-type" in w for w in inv.warnings)


def test_label_value_that_is_no_group_name_is_sanitised_with_warning():
    inv = build(v1beta2_with_metal3(), MappingOptions())
    assert inv.groups["GPU_Compute_v2"] == ["hpc-compute-7d9f8-zb4ct"]
    assert inv.hosts["hpc-compute-7d9f8-zb4ct"]["capi"]["node_type"] == "GPU_Compute.v2"
    assert any("hpc-compute-7d9f8-zb4ct" in w and "GPU_Compute_v2" in w for w in inv.warnings)


def test_running_machine_with_no_address_is_skipped_with_warning():
    objects = v1beta2_with_metal3()
    machine = copy.deepcopy(objects["machines"][0])
    machine["metadata"]["name"] = "no-address"
    machine["status"]["addresses"] = []
    machine["status"]["phase"] = "Running"
    machine["spec"]["infrastructureRef"] = {"kind": "Metal3Machine", "name": "nowhere"}
    objects["machines"].append(machine)
    inv = build(objects, MappingOptions())
    assert "no-address" not in inv.hosts
    assert any("no-address" in w and "no address" in w for w in inv.warnings)


def test_hostvars_carry_machine_and_metal3_hardware():
    inv = build(v1beta2_with_metal3(), MappingOptions(hostvars="full"))
    host = inv.hosts["hpc-compute-7d9f8-abcde"]
    assert host["ansible_host"] == "192.168.111.21"
    capi = host["capi"]
    assert capi["namespace"] == "metal3" and capi["cluster"] == "hpc" and capi["phase"] == "Provisioned"
    assert capi["provider_id"] == "metal3://metal3/hpc-cn-01/hpc-compute-7d9f8-abcde"
    assert capi["machine_deployment"] == "hpc-compute" and capi["machine_set"] == "hpc-compute-7d9f8"
    assert capi["bmh"] == "hpc-cn-01" and capi["cpus"] == 128 and capi["ram_mib"] > 0
    assert [n["name"] for n in capi["nics"]] == ["eno1", "ens3f0np0"]
    controller = inv.hosts["hpc-controller-5c6b9-x7k2p"]["capi"]
    assert controller["cpus"] == 32 and controller["node_ref"] == "hpc-ctl-01"


def test_lean_hostvars_hold_what_the_collection_reads():
    full = build(v1beta2_with_metal3(), MappingOptions(hostvars="full"))
    lean = build(v1beta2_with_metal3(), MappingOptions())
    assert lean.groups == full.groups
    for host, hostvars in lean.hosts.items():
        capi, whole = hostvars["capi"], full.hosts[host]["capi"]
        assert tuple(capi) == LEAN_KEYS
        assert hostvars["ansible_host"] == full.hosts[host]["ansible_host"]
        for key in set(LEAN_KEYS) - {"labels", "annotations"}:
            assert capi[key] == whole[key], (host, key)
        # Cluster API's own labels are in cluster/machine_deployment; the user's stay
        assert not [k for k in capi["labels"] if k.startswith("cluster.x-k8s.io/") or k == "machine-template-hash"]
        assert {k: v for k, v in whole["labels"].items() if k in capi["labels"]} == capi["labels"]
    compute = lean.hosts["hpc-compute-7d9f8-abcde"]["capi"]
    assert compute["labels"]["node-type"] == "compute" and compute["cpus"] == 128 and compute["hostname"]
    assert "slurm.example.org/partition" in compute["labels"]
    # the deletion hook the playbooks look for is not Cluster API's own: it stays
    deleting = lean.hosts["hpc-compute-7d9f8-pqrst"]["capi"]
    assert deleting["deleting"] is True
    assert "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slurm" in deleting["annotations"]


def test_lean_annotations_leave_out_last_applied_configuration():
    objects = v1beta2_with_metal3()
    machine = [m for m in objects["machines"] if m["metadata"]["name"] == "hpc-compute-7d9f8-abcde"][0]
    machine["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 4000 + "}",
                                          "cluster.x-k8s.io/delete-machine": "",
                                          "slurm.converged.hpc/gres": "gpu:a100:4"}
    lean = build(objects, MappingOptions()).hosts["hpc-compute-7d9f8-abcde"]["capi"]
    assert lean["annotations"] == {"slurm.converged.hpc/gres": "gpu:a100:4"}
    full = build(objects, MappingOptions(hostvars="full")).hosts["hpc-compute-7d9f8-abcde"]["capi"]
    assert len(full["annotations"]) == 3


def test_v1beta1_created_machine_refs_without_apigroup_still_join_metal3():
    inv = build(v1beta2_with_metal3(), MappingOptions(hostvars="full"))
    capi = inv.hosts["edge-workers-6f5d4-m2wq7"]["capi"]
    assert capi["bmh"] == "edge-01" and capi["cpus"] == 128


def test_machines_read_through_v1beta1_map_the_same():
    objects = recorded("machines-v1beta1.yaml", metal3=False)
    objects["metal3machines"] = v1beta2_with_metal3()["metal3machines"]
    objects["baremetalhosts"] = v1beta2_with_metal3()["baremetalhosts"]
    v1 = build(objects, MappingOptions())
    v2 = build(v1beta2_with_metal3(), MappingOptions())
    assert v1.groups == v2.groups
    assert v1.hosts["hpc-compute-7d9f8-abcde"]["capi"]["api_version"] == "cluster.x-k8s.io/v1beta1"
    assert v1.hosts["hpc-compute-7d9f8-abcde"]["capi"]["cpus"] == 128


def test_without_metal3_hosts_have_no_hardware():
    inv = build(recorded(metal3=False), MappingOptions(hostvars="full"))
    capi = inv.hosts["hpc-compute-7d9f8-abcde"]["capi"]
    assert capi["cpus"] is None and capi["nics"] == [] and capi["bmh"] is None
    assert inv.hosts["hpc-compute-7d9f8-abcde"]["ansible_host"] == "192.168.111.21"


@pytest.mark.parametrize("opts", [MappingOptions(nic_names=("ens3f0np0",)),
                                  MappingOptions(nic_cidrs=("10.40.0.0/24",))])
def test_multi_nic_preference(opts):
    inv = build(v1beta2_with_metal3(), opts)
    assert inv.hosts["hpc-compute-7d9f8-abcde"]["ansible_host"] == "10.40.0.21"


def test_nic_preference_falls_back_to_machine_address():
    inv = build(v1beta2_with_metal3(), MappingOptions(nic_cidrs=("172.31.0.0/16",)))
    assert inv.hosts["hpc-compute-7d9f8-abcde"]["ansible_host"] == "192.168.111.21"


def test_bad_cidr_names_the_value():
    with pytest.raises(ValueError, match="not-a-cidr"):
        build(v1beta2_with_metal3(), MappingOptions(nic_cidrs=("not-a-cidr",)))


def test_address_type_preference():
    inv = build(v1beta2_with_metal3(), MappingOptions(address_types=("Hostname",)))
    assert inv.hosts["hpc-compute-7d9f8-abcde"]["ansible_host"] == "hpc-cn-01"


def test_host_naming_by_node_ref():
    inv = build(v1beta2_with_metal3(), MappingOptions(host_naming="node"))
    assert "hpc-ctl-01" in inv.groups["controller"]
    assert "hpc-controller-5c6b9-q8m4n" in inv.groups["controller"]  # no nodeRef: keeps its Machine name


def test_host_naming_by_hostname():
    # the recorded hpc-compute-7d9f8-abcde reports Hostname hpc-cn-01 (test_address_type_preference)
    inv = build(v1beta2_with_metal3(), MappingOptions(host_naming="hostname", hostvars="full"))
    assert "hpc-cn-01" in inv.groups["compute"] and "hpc-compute-7d9f8-abcde" not in inv.hosts
    assert inv.hosts["hpc-cn-01"]["capi"]["name"] == "hpc-compute-7d9f8-abcde"  # the Machine's name stays a variable
    unnamed = [m for m in recorded()["machines"]
               if not any(a["type"] == "Hostname" for a in (m.get("status") or {}).get("addresses") or [])]
    for machine in unnamed:  # no Hostname address: keeps its Machine name
        assert machine["metadata"]["name"] in inv.hosts or machine["metadata"]["name"] in inv.skipped \
            or "%s/%s" % (machine["metadata"]["namespace"], machine["metadata"]["name"]) in inv.skipped


def test_prefix_and_cluster_filter():
    inv = build(v1beta2_with_metal3(), MappingOptions(group_prefix="slurm_", clusters=("edge",)))
    assert sorted(inv.groups) == ["capi_cluster_edge", "capi_md_edge_workers", "slurm_compute"]


def test_phase_filter():
    inv = build(v1beta2_with_metal3(), MappingOptions(phases=("Running",)))
    assert inv.groups["controller"] == ["hpc-controller-5c6b9-x7k2p"]


def test_same_name_in_two_namespaces_is_qualified():
    objects = v1beta2_with_metal3()
    twin = copy.deepcopy([m for m in objects["machines"] if m["metadata"]["name"] == "hpc-compute-7d9f8-abcde"][0])
    twin["metadata"]["namespace"] = "other"
    objects["machines"].append(twin)
    inv = build(objects, MappingOptions())
    assert "other_hpc-compute-7d9f8-abcde" in inv.hosts


def test_machine_deployments_of_one_name_in_two_namespaces_are_two_groups():
    objects = v1beta2_with_metal3()
    twin = copy.deepcopy([m for m in objects["machines"] if m["metadata"]["name"] == "hpc-compute-7d9f8-abcde"][0])
    twin["metadata"].update(namespace="other", name="other-compute-1")
    objects["machines"].append(twin)
    inv = build(objects, MappingOptions())
    assert "capi_md_hpc_compute" not in inv.groups  # never one group for two MachineDeployments
    assert inv.groups["capi_md_other_hpc_compute"] == ["other-compute-1"]
    assert "hpc-compute-7d9f8-abcde" in inv.groups["capi_md_metal3_hpc_compute"]
    assert "other-compute-1" not in inv.groups["capi_md_metal3_hpc_compute"]
    clash = "MachineDeployment hpc-compute exists in namespaces metal3, other"
    assert [w for w in inv.warnings if w.startswith(clash)], inv.warnings


def test_a_new_machine_never_renames_an_existing_host():
    # a Machine of the same name appears in a namespace that sorts first ("a-early" < "metal3"):
    # the older Machine keeps the bare name, the new one is qualified, whatever the list order
    objects = v1beta2_with_metal3()
    old = [m for m in objects["machines"] if m["metadata"]["name"] == "hpc-compute-7d9f8-abcde"][0]
    before = build(copy.deepcopy(objects), MappingOptions())
    assert before.hosts["hpc-compute-7d9f8-abcde"]["capi"]["namespace"] == old["metadata"]["namespace"]
    twin = copy.deepcopy(old)
    twin["metadata"].update(namespace="a-early", uid="new-uid", creationTimestamp="2099-01-01T00:00:00Z")
    for order in (lambda ms: [twin] + ms, lambda ms: ms + [twin]):
        trial = copy.deepcopy(objects)
        trial["machines"] = order(trial["machines"])
        inv = build(trial, MappingOptions(hostvars="full"))
        assert inv.hosts["hpc-compute-7d9f8-abcde"]["capi"]["namespace"] == old["metadata"]["namespace"]
        assert inv.hosts["a-early_hpc-compute-7d9f8-abcde"]["capi"]["uid"] == "new-uid"
        assert any("belongs to the older Machine %s/hpc-compute-7d9f8-abcde" % old["metadata"]["namespace"] in w
                   for w in inv.warnings), inv.warnings


@pytest.mark.parametrize("raw,clean", [("compute", "compute"), ("GPU_Compute.v2", "GPU_Compute_v2"),
                                       ("4gpu", "_4gpu"), ("a-b", "a_b")])
def test_sanitize_group(raw, clean):
    assert sanitize_group(raw) == clean


def test_trim_keeps_what_the_mapping_reads():
    machine = v1beta2_with_metal3()["machines"][0]
    small = trim(machine, MACHINE_SPEC, MACHINE_STATUS)
    assert set(small["spec"]) <= set(MACHINE_SPEC) and "conditions" not in small["status"]
    assert build({"machines": [small]}, MappingOptions()).hosts.keys() == \
        build({"machines": [machine]}, MappingOptions()).hosts.keys()


@pytest.mark.parametrize("size", [1, 2, 3, 10])
def test_pages_mapped_alone_and_merged_are_the_whole_list_mapped(size):
    machines = recorded(metal3=False)["machines"]
    opts = MappingOptions()
    assert pages_map_alone(machines, opts)
    pages = [build({"machines": machines[i:i + size]}, opts) for i in range(0, len(machines), size)]
    merged, whole = merge(pages), build({"machines": machines}, opts)
    assert (merged.hosts, merged.groups, merged.warnings, merged.skipped) == \
        (whole.hosts, whole.groups, whole.warnings, whole.skipped)
    assert list(merged.hosts) == list(whole.hosts) and list(merged.groups) == list(whole.groups)


def test_pages_do_not_map_alone_when_a_name_or_a_deployment_is_shared():
    machines = recorded(metal3=False)["machines"]
    twin = copy.deepcopy(next(m for m in machines if m["metadata"]["namespace"] == "metal3"))
    twin["metadata"]["namespace"] = "lab2"
    assert not pages_map_alone(machines + [twin], MappingOptions())
    # only the Machines of the clusters read count
    assert pages_map_alone(machines + [dict(twin, spec=dict(twin["spec"], clusterName="other"))],
                           MappingOptions(clusters=("hpc", "edge")))
    other = copy.deepcopy(twin)
    other["metadata"]["name"] = "another"
    assert not pages_map_alone(machines + [other], MappingOptions())  # its MachineDeployment in two namespaces
    # the same Machine outside any MachineDeployment: nothing shared
    node = copy.deepcopy(other)
    node["metadata"]["labels"] = {k: v for k, v in node["metadata"]["labels"].items() if "deployment" not in k}
    assert pages_map_alone(machines + [node], MappingOptions())


HOSTILE_NAMES = ["{{ lookup('ansible.builtin.pipe', 'id') }}", "cn 01", "cn-01;reboot", "", "-cn01", "cn01-",
                 "a" * 64, "cn..01", "../etc/passwd", "cn\u00fc01", "cn01\n", "x" * 300]


def with_hostname(hostname):
    """The recorded objects, hpc-compute-7d9f8-abcde's Hostname address made hostname."""
    objects = copy.deepcopy(v1beta2_with_metal3())
    machine = next(m for m in objects["machines"] if m["metadata"]["name"] == "hpc-compute-7d9f8-abcde")
    for address in machine["status"]["addresses"]:
        if address["type"] == "Hostname":
            address["address"] = hostname
    return objects


@pytest.mark.parametrize("hostname", HOSTILE_NAMES)
def test_a_host_name_that_is_no_host_name_skips_its_machine_naming_it(hostname):
    # host_naming hostname takes the Machine's Hostname address, which CAPM3 copies from the host's hardware
    # details: whoever may edit a BareMetalHost (its hardwaredetails annotation) writes it
    objects = with_hostname(hostname)
    inv = build(objects, MappingOptions(host_naming="hostname"))
    if hostname:
        assert "metal3/hpc-compute-7d9f8-abcde" in inv.skipped
        assert not any(hostname in h for h in inv.hosts)
        warning = next(w for w in inv.warnings if "hpc-compute-7d9f8-abcde" in w)
        assert "is not a valid host name" in warning and "(host_naming: hostname)" in warning
        assert len(warning) < 300
    else:  # an empty Hostname address is no Hostname: the Machine's name, as before
        assert "hpc-compute-7d9f8-abcde" in inv.hosts
    assert len(inv.hosts) >= 5  # the others are mapped as ever


@pytest.mark.parametrize("hostname", ["CN01", "cn-01.hpc.example.org", "a" * 63, "7", "cn01"])
def test_host_names_of_any_valid_form_are_taken(hostname):
    objects = with_hostname(hostname)
    assert hostname in build(objects, MappingOptions(host_naming="hostname")).hosts


@pytest.mark.parametrize("seed", range(40))
def test_objects_with_fields_missing_or_hostile_text_map_or_skip_never_crash(seed):
    """Seeded: fields the API allows to be absent dropped at random, and text values replaced with hostile
    text (a template, huge, control characters); the API server's schema keeps the types. Every Machine is
    mapped or skipped with its name, and whatever is mapped has a valid host name."""
    import random

    rnd = random.Random(seed)
    hostile = ["{{ lookup('ansible.builtin.pipe', 'id') }}", "x" * 5000, "a\nb\tc", "\u202eevil", "$(reboot)", ""]
    objects = copy.deepcopy(v1beta2_with_metal3())

    # what the API server validates keeps its form: object names, namespaces, uids, timestamps, label values,
    # owner references; the rest (status, spec, annotations) is text anyone with write access chose
    checked = {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "labels", "ownerReferences",
               "apiVersion", "kind", "resourceVersion", "generation"}

    def mutate(node, path):
        if isinstance(node, dict):
            for key in list(node):
                roll = rnd.random()
                if path[:1] == ("metadata",) and key in checked:
                    if key == "labels" and roll < 0.2 and node[key]:
                        del node[key][rnd.choice(sorted(node[key]))]
                    continue
                if path == () and key in ("metadata", "apiVersion", "kind"):
                    mutate(node[key], (key,))
                elif roll < 0.08:
                    del node[key]
                elif roll < 0.16 and isinstance(node[key], str):
                    node[key] = rnd.choice(hostile)
                else:
                    mutate(node[key], path + (key,))
        elif isinstance(node, list):
            for item in node:
                mutate(item, path)

    for kind in objects.values():
        for obj in kind:
            mutate(obj, ())
    for naming in ("machine", "node", "hostname"):
        inv = build(copy.deepcopy(objects), MappingOptions(host_naming=naming, hostvars=rnd.choice(["lean", "full"])))
        assert len(inv.hosts) + len(inv.skipped) <= len(objects["machines"])
        for host in inv.hosts:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+", host) and len(host) <= 253 + 64, host
        for group in inv.groups:
            assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", group), group
