"""The node-type contract applied to inventories: groups, Slurm names, and every error named."""

import copy
import re

import pytest

from ansible_collections.converged.hpc.plugins.filter.contract import (
    check_contract,
    contract,
    expand_hostlist,
    gres_conf,
    gres_device_files,
    gres_types,
    nodesets,
    parse_gres,
    partitions_with_nodes,
    placeholders,
)

NODE_TYPES = {
    "controller": {"role": "controller"},
    "compute": {"role": "compute", "nodeset": "computeset", "partitions": ["compute"]},
    "login": {"role": "login"},
}
PARTITIONS = [{"name": "compute", "default": True}]


def capi(node_type, cluster="a", hostname=None, deleting=False):
    return {"capi": {"node_type": node_type, "cluster": cluster, "hostname": hostname, "deleting": deleting}}


def run(hostvars, groups=None, **kw):
    groups = dict(groups or {})
    groups.setdefault("all", list(hostvars))
    return contract(hostvars, groups, NODE_TYPES, PARTITIONS, **kw)


def by_name(result):
    return {h["name"]: h for h in result["hosts"]}


def test_capi_hosts_grouped_by_role_whatever_the_group_prefix():
    hv = {"slurm-ctl": capi("controller"), "m-cn-1": capi("compute", hostname="cn-1"), "m-login": capi("login")}
    res = run(hv, {"slurm_controller": ["slurm-ctl"], "slurm_compute": ["m-cn-1"]})
    assert res["errors"] == []
    hosts = by_name(res)
    assert hosts["slurm-ctl"]["groups"] == ["converged_controller", "converged_slurm"]
    assert hosts["m-cn-1"]["groups"] == ["converged_compute", "converged_slurm"]
    assert hosts["m-login"]["groups"] == ["converged_login", "converged_slurm"]
    # the Slurm node name is the Metal3 host's hostname; the nodeset comes from the node type
    assert hosts["m-cn-1"]["vars"] == {"converged_node_type": "compute", "converged_role": "compute",
                                       "converged_slurm_node_name": "cn-1", "converged_slurm_nodeset": "computeset",
                                       "converged_slurm_features": ["compute"], "converged_slurm_gres": ""}


def test_features_are_the_node_type_then_feature_labels():
    labeled = capi("compute")
    labeled["capi"]["labels"] = {"feature.slurm.converged.hpc/nvme": "true", "feature.slurm.converged.hpc/gpu": "1",
                                 "feature.slurm.converged.hpc/ib": "false", "node-type": "compute",
                                 "feature.slurm.converged.hpc/": "x", "other/gpu": "true",
                                 "feature.slurm.converged.hpc/compute": "true"}
    hosts = by_name(run({"cn": labeled, "ctl": capi("controller")}))
    assert hosts["cn"]["vars"]["converged_slurm_features"] == ["compute", "gpu", "nvme"]
    assert "converged_slurm_features" not in hosts["ctl"]["vars"]
    hosts = by_name(run({"cn": labeled}, feature_label_prefix="hw/"))
    assert hosts["cn"]["vars"]["converged_slurm_features"] == ["compute"]


def test_static_inventory_by_group_name_and_short_names():
    hv = {"ctl-01": {}, "cn-01.example.org": {}, "st-01": {}}
    res = run(hv, {"controller": ["ctl-01"], "compute": ["cn-01.example.org"], "storage": ["st-01"]})
    hosts = by_name(res)
    assert set(hosts) == {"ctl-01", "cn-01.example.org"}  # st-01 has no node type of the contract
    assert hosts["cn-01.example.org"]["vars"]["converged_slurm_node_name"] == "cn-01"


def test_an_explicit_node_type_and_node_name_win():
    hv = {"x": dict(capi("compute"), converged_node_type="login"),
          "y": dict(capi("compute"), converged_slurm_node_name="gpu-07")}
    hosts = by_name(run(hv))
    assert hosts["x"]["groups"][0] == "converged_login"
    assert hosts["y"]["vars"]["converged_slurm_node_name"] == "gpu-07"


def test_leaving_hosts_are_only_in_the_leaving_groups():
    hosts = by_name(run({"cn": capi("compute", deleting=True), "ctl": capi("controller", deleting=True)}))
    assert hosts["cn"]["groups"] == ["converged_leaving", "converged_leaving_compute"]
    assert hosts["ctl"]["groups"] == ["converged_leaving", "converged_leaving_controller"]


def test_node_types_outside_the_contract_are_reported_not_converged():
    res = run({"s": capi("storage"), "c": capi("controller")})
    assert [h["name"] for h in res["hosts"]] == ["c"]
    assert res["ignored"] == ["s (node type storage)"]


def test_one_cluster_at_a_time():
    hv = {"a-ctl": capi("controller", "a"), "b-ctl": capi("controller", "b"), "b-cn": capi("compute", "b")}
    res = run(hv, play_hosts=list(hv))
    assert any("belong to 2 Cluster API clusters (a, b)" in e for e in res["errors"])
    # --limit capi_cluster_b: only b's hosts, and a new b host still finds its controller
    res = run(hv, play_hosts=["b-cn"])
    assert res["errors"] == [] and res["clusters"] == ["b"]
    assert sorted(h["name"] for h in res["hosts"]) == ["b-cn", "b-ctl"]
    res = run(hv, cluster="a", play_hosts=list(hv))
    assert [h["name"] for h in res["hosts"]] == ["a-ctl"]


def test_two_hosts_with_one_slurm_name_fail():
    res = run({"m1": capi("compute", hostname="cn-1"), "m2": capi("compute", hostname="cn-1")})
    assert any("m1 and m2 would both be Slurm node cn-1" in e for e in res["errors"])


@pytest.mark.parametrize("change, message", [
    (lambda t, p: t["compute"].pop("nodeset"), "node type compute (role compute) maps to no Slurm nodeset"),
    (lambda t, p: t["compute"].update(partitions=[]), "node type compute (role compute) is in no partition"),
    (lambda t, p: t["compute"].update(partitions=["batch"]),
     "node type compute names partition(s) batch that converged_partitions does not define"),
    (lambda t, p: p.append({"name": "batch"}), "partition(s) batch hold no nodeset"),
    (lambda t, p: t.update(gpu={"role": "compute", "nodeset": "computeset", "partitions": ["compute"]}),
     "nodeset computeset is fed by two node types (compute and gpu)"),
    (lambda t, p: t.update(gpu={"role": "accelerator"}), "node type gpu: role 'accelerator' is not one of"),
    (lambda t, p: t.pop("controller"), "no node type has role controller"),
    (lambda t, p: t["login"].update(nodeset="loginset"), "node type login (role login) names a nodeset"),
    (lambda t, p: p.append({"name": "compute"}), "converged_partitions defines compute more than once"),
    (lambda t, p: p.append({"name": "bad name", "default": True}), "'bad name' is not a valid Slurm partition"),
])
def test_contract_errors_name_what_is_wrong(change, message):
    types, parts = copy.deepcopy(NODE_TYPES), copy.deepcopy(PARTITIONS)
    change(types, parts)
    errors = check_contract(types, parts)
    assert any(message in e for e in errors), errors


def test_nodesets_and_partitions_come_from_the_node_types():
    types = dict(NODE_TYPES, gpu={"role": "compute", "nodeset": "gpuset", "partitions": ["gpu", "compute"]})
    assert [(n["name"], n["feature"]) for n in nodesets(types)] == [("computeset", "compute"), ("gpuset", "gpu")]
    parts = partitions_with_nodes(types, PARTITIONS + [{"name": "gpu"}])
    assert [(p["name"], p["nodesets"]) for p in parts] == [("compute", ["computeset", "gpuset"]), ("gpu", ["gpuset"])]


def test_placeholders_per_nodeset_carry_the_most_gres_its_node_type_and_hosts_declare():
    types = dict(NODE_TYPES, gpu={"role": "compute", "nodeset": "gpuset", "partitions": ["gpu"], "gres": "gpu:1"})
    hostvars = {"g1": {"converged_slurm_nodeset": "gpuset", "converged_slurm_gres": "gpu:a100:2,nvme:1"},
                "g2": {"converged_slurm_nodeset": "gpuset", "converged_slurm_gres": "gpu:a100:4"},
                "c1": {"converged_slurm_nodeset": "computeset", "converged_slurm_gres": ""},
                "bad": {"converged_slurm_nodeset": "gpuset", "converged_slurm_gres": "gpu:a100:x"}}
    out = placeholders(types, hostvars, ["g1", "g2", "c1", "bad"], count=4, cpus=64, memory_mib=1024)
    assert out == [
        {"NodeName": "computeset-future-[1-4]", "State": "FUTURE", "Feature": "compute", "Sockets": 1,
         "CoresPerSocket": 64, "ThreadsPerCore": 1, "RealMemory": 1024, "Gres": ""},
        {"NodeName": "gpuset-future-[1-4]", "State": "FUTURE", "Feature": "gpu", "Sockets": 1,
         "CoresPerSocket": 64, "ThreadsPerCore": 1, "RealMemory": 1024, "Gres": "gpu:a100:4,nvme:1"}]
    assert placeholders(types, hostvars, ["g1"], count="1")[1]["NodeName"] == "gpuset-future-1"
    assert placeholders(types, {}, [], count=1)[1]["Gres"] == "gpu:1"


@pytest.mark.parametrize("count", [0, "0", "", None])
def test_no_placeholders_when_the_count_is_zero(count):
    assert placeholders(NODE_TYPES, {}, [], count=count) == []


# ------------------------------------------------------------------ accounting: where slurmdbd runs
WITH_DB = dict(NODE_TYPES, accounting={"role": "accounting"})


def run_db(hostvars, **kw):
    return contract(hostvars, {"all": list(hostvars)}, WITH_DB, PARTITIONS, **kw)


def test_accounting_off_chooses_no_slurmdbd_host():
    res = run_db({"ctl-1": capi("controller"), "db-1": capi("accounting")})
    assert res["errors"] == [] and res["slurmdbd"] == ""
    assert all("converged_slurmdbd" not in h["groups"] for h in res["hosts"])


def test_slurmdbd_on_the_accounting_host_when_there_is_one():
    res = run_db({"ctl-2": capi("controller"), "ctl-1": capi("controller"), "db-2": capi("accounting"),
                  "db-1": capi("accounting")}, accounting=True)
    assert res["errors"] == [] and res["slurmdbd"] == "db-1"
    hosts = by_name(res)
    assert hosts["db-1"]["groups"] == ["converged_accounting", "converged_slurm", "converged_slurmdbd"]
    assert "converged_slurmdbd" not in hosts["db-2"]["groups"] + hosts["ctl-1"]["groups"]


def test_slurmdbd_on_the_first_controller_without_an_accounting_host():
    res = run_db({"ctl-2": capi("controller"), "ctl-1": capi("controller"), "cn": capi("compute")}, accounting=True)
    assert res["errors"] == [] and res["slurmdbd"] == "ctl-1"
    # a leaving controller is never chosen
    res = run_db({"ctl-1": capi("controller", deleting=True), "ctl-2": capi("controller")}, accounting=True)
    assert res["slurmdbd"] == "ctl-2"


def test_slurmdbd_node_type_named_by_the_administrator():
    res = run_db({"ctl-1": capi("controller"), "db-1": capi("accounting")}, accounting=True,
                 accounting_node_type="controller")
    assert res["slurmdbd"] == "ctl-1"


def test_accounting_with_no_host_to_run_slurmdbd_is_an_error_naming_the_node_type():
    res = run_db({"ctl-1": capi("controller")}, accounting=True, accounting_node_type="accounting")
    assert res["slurmdbd"] == ""
    assert res["errors"] == ["accounting is on (converged_accounting) but no host can run slurmdbd: node type "
                             "accounting has no Machine that is not being deleted"]
    res = run_db({"ctl-1": capi("controller")}, accounting=True, accounting_node_type="database")
    assert res["errors"] == ["converged_accounting_node_type 'database' is not a node type of the contract "
                             "(accounting, compute, controller, login)"]
    res = run_db({"db-1": capi("accounting", deleting=True), "cn": capi("compute")}, accounting=True)
    assert "node type controller has no Machine" in res["errors"][-1]


def test_gres_from_the_annotation_wins_over_the_node_type():
    node_types = dict(NODE_TYPES, gpu={"role": "compute", "nodeset": "gpuset", "partitions": ["compute"],
                                       "gres": "gpu:2"})
    annotated = capi("gpu")
    annotated["capi"]["annotations"] = {"slurm.converged.hpc/gres": "gpu:a100:4,nvme:1"}
    hv = {"g1": capi("gpu"), "g2": annotated, "cn": capi("compute"), "ctl": capi("controller")}
    res = contract(hv, {"all": list(hv)}, node_types, PARTITIONS)
    assert res["errors"] == []
    hosts = by_name(res)
    assert hosts["g1"]["vars"]["converged_slurm_gres"] == "gpu:2"
    assert hosts["g2"]["vars"]["converged_slurm_gres"] == "gpu:a100:4,nvme:1"
    assert hosts["cn"]["vars"]["converged_slurm_gres"] == ""
    assert "converged_slurm_gres" not in hosts["ctl"]["vars"]
    assert res["gres_types"] == ["gpu", "nvme"]


def test_gres_types_come_from_node_types_even_without_hosts():
    node_types = dict(NODE_TYPES, gpu={"role": "compute", "nodeset": "gpuset", "partitions": ["compute"],
                                       "gres": "gpu:a100:4"})
    res = contract({"ctl": capi("controller")}, {"all": ["ctl"]}, node_types, PARTITIONS)
    assert res["errors"] == [] and res["gres_types"] == ["gpu"]


@pytest.mark.parametrize("value, message", [
    ("gpu", "'gpu' is not a GRES of the form name[:type]:count"),
    ("gpu:a100:0", "'gpu:a100:0' is not a GRES"),
    ("GPU:2", "'GPU:2' is not a GRES"),
    ("gpu:a100:2,gpu:a100:1", "gpu:a100:1 is declared twice"),
    ("gpu:a 100:2", "'gpu:a 100:2' is not a GRES"),
])
def test_bad_gres_named_with_its_host(value, message):
    annotated = capi("compute")
    annotated["capi"]["annotations"] = {"slurm.converged.hpc/gres": value}
    res = run({"cn": annotated})
    assert len(res["errors"]) == 1
    assert res["errors"][0].startswith("host cn: annotation slurm.converged.hpc/gres: ") and message in res["errors"][0]


def test_bad_gres_on_a_node_type_and_gres_outside_compute_fail():
    node_types = dict(NODE_TYPES, gpu={"role": "compute", "nodeset": "gpuset", "partitions": ["compute"],
                                       "gres": "gpu:x"}, login={"role": "login", "gres": "gpu:1"})
    errors = check_contract(node_types, PARTITIONS)
    assert any(e.startswith("node type gpu: gres 'gpu:x' is not a GRES") for e in errors)
    assert any("node type login (role login) names a nodeset, partitions, gres or gres_nodes" in e for e in errors)


def test_parse_gres_and_types():
    assert parse_gres("gpu:a100:4, nvme:1") == [
        {"name": "gpu", "type": "a100", "count": 4}, {"name": "nvme", "type": "", "count": 1}]
    assert gres_types(["gpu:2", "", None, "bad", "gpu:a100:1,mps:100"]) == ["gpu", "mps"]


def test_gres_conf_lines_per_node_with_device_files_or_counts():
    hv = {"m-gpu-1": {"converged_slurm_node_name": "gpu-1", "converged_slurm_gres": "gpu:a100:4,nvme:1"},
          "m-gpu-2": {"converged_slurm_node_name": "gpu-2", "converged_slurm_gres": "gpu:1"},
          "cn": {"converged_slurm_node_name": "cn", "converged_slurm_gres": ""}}
    devices = {"gpu": "/dev/nvidia"}
    assert gres_conf(["m-gpu-2", "cn", "m-gpu-1"], hv, devices) == [
        "NodeName=gpu-1 Name=gpu Type=a100 File=/dev/nvidia[0-3]",
        "NodeName=gpu-1 Name=nvme Count=1",
        "NodeName=gpu-2 Name=gpu File=/dev/nvidia0"]
    # slurmd finds the GPUs itself (NVML): only the other GRES are spelled out
    assert gres_conf(["m-gpu-1"], hv, devices, autodetect="nvml") == [
        "AutoDetect=nvml", "NodeName=gpu-1 Name=nvme Count=1"]


def test_a_hostlist_stands_for_its_names_in_order():
    assert expand_hostlist("gpu-[01-03,10],spare") == ["gpu-01", "gpu-02", "gpu-03", "gpu-10", "spare"]
    assert expand_hostlist(["r[1-2]n[8-9]", "x"]) == ["r1n8", "r1n9", "r2n8", "r2n9", "x"]
    assert expand_hostlist("bm-[9-11]") == ["bm-9", "bm-10", "bm-11"]
    for bad, said in (("gpu-[01-03", "brackets do not match"), ("gpu-[3-1]", "runs backwards"),
                      ("gpu-[a-b]", "is not a number"), ("gpu-01,,x", "an empty name"), ("gpu 01", "not a valid"),
                      ("n[0-99999]", "more than 65536 names")):
        with pytest.raises(ValueError, match=re.escape(said)):
            expand_hostlist(bad)


def test_gres_conf_names_a_node_types_hosts_ahead_and_a_host_that_comes_or_goes_changes_nothing():
    node_types = {"gpu": {"role": "compute", "gres": "gpu:lab:2", "gres_nodes": "bm-[01-03]"},
                  "compute": {"role": "compute", "gres_nodes": "cn-[1-9]"}}  # no gres: nothing ahead
    devices = {"gpu": "/dev/nvidia"}
    ahead = gres_conf([], {}, devices, node_types=node_types)
    assert ahead == ["NodeName=bm-%02d Name=gpu Type=lab File=/dev/nvidia[0-1]" % i for i in (1, 2, 3)]
    # bm-02 joined with the node type's GRES: the same file; with other GRES (its Machine's annotation), its own
    hv = {"m-x": {"converged_slurm_node_name": "bm-02", "converged_slurm_gres": "gpu:lab:2"},
          "m-y": {"converged_slurm_node_name": "bm-03", "converged_slurm_gres": "gpu:lab:1"}}
    assert gres_conf(["m-x"], hv, devices, node_types=node_types) == ahead
    assert gres_conf(["m-x", "m-y"], hv, devices, node_types=node_types)[2] == "NodeName=bm-03 Name=gpu Type=lab File=/dev/nvidia0"
    assert gres_conf([], {}, devices, autodetect="nvml", node_types=node_types) == ["AutoDetect=nvml"]


def test_gres_nodes_checked_with_the_contract():
    parts = [{"name": "compute"}, {"name": "gpu"}]
    base = {"controller": {"role": "controller"},
            "compute": {"role": "compute", "nodeset": "cs", "partitions": ["compute"]}}
    bad = dict(base, gpu={"role": "compute", "nodeset": "gs", "partitions": ["gpu"], "gres": "gpu:2",
                          "gres_nodes": "bm-[01-0x]"})
    assert any("node type gpu: gres_nodes 'bm-[01-0x]': '01-0x' is not a number" in e for e in check_contract(bad, parts))
    bare = dict(base, gpu={"role": "compute", "nodeset": "gs", "partitions": ["gpu"], "gres_nodes": "bm-1"})
    assert any("node type gpu names gres_nodes but declares no gres" in e for e in check_contract(bare, parts))
    twice = dict(base, gpu={"role": "compute", "nodeset": "gs", "partitions": ["gpu"], "gres": "gpu:2", "gres_nodes": "bm-[1-2]"})
    twice["compute"] = dict(base["compute"], gres="nvme:1", gres_nodes="bm-2")
    assert any("node bm-2 is in the gres_nodes of node types compute and gpu" in e for e in check_contract(twice, parts))
    good = dict(base, gpu={"role": "compute", "nodeset": "gs", "partitions": ["gpu"], "gres": "gpu:2", "gres_nodes": "bm-[1-2]"})
    assert check_contract(good, parts) == []


def test_hosts_come_by_slurm_node_name_so_the_primary_is_the_first_name_not_the_first_machine():
    # Cluster API names a MachineDeployment's Machines <deployment>-<hash>-<random>: the inventory lists them
    # in that order, which says nothing of the hosts; ctl-01 is the primary whatever its Machine is called
    hv = {"clab-controller-x7b2q-abcde": capi("controller", hostname="ctl-02"),
          "clab-controller-x7b2q-zzzzz": capi("controller", hostname="ctl-01"),
          "clab-compute-k2m9d-aaaaa": capi("compute", hostname="cn-02"),
          "clab-compute-k2m9d-bbbbb": capi("compute", hostname="cn-01")}
    res = run(hv)
    assert res["errors"] == []
    order = [h["vars"]["converged_slurm_node_name"] for h in res["hosts"]]
    assert order == ["cn-01", "cn-02", "ctl-01", "ctl-02"]
    controllers = [h["name"] for h in res["hosts"] if "converged_controller" in h["groups"]]
    assert controllers == ["clab-controller-x7b2q-zzzzz", "clab-controller-x7b2q-abcde"]


@pytest.mark.parametrize("gres, autodetect, files", [
    ("gpu:a100:2", "", ["/dev/nvidia0", "/dev/nvidia1"]),
    ("gpu:2,nvme:1", "", ["/dev/nvidia0", "/dev/nvidia1"]),  # nvme: no device file prefix, none needed
    ("gpu:a100:2", "nvml", []),  # slurmd finds the devices
    ("", "", []),
    (None, "", []),
    ([{"name": "gpu", "type": "", "count": 1}], "", ["/dev/nvidia0"]),
])
def test_the_device_files_a_gres_needs(gres, autodetect, files):
    """One list for slurm_compute's check on a node and join at boot's: gres_device_files."""
    assert gres_device_files(gres, {"gpu": "/dev/nvidia"}, autodetect) == files


def test_the_device_files_of_a_bad_gres_name_the_bad_part():
    with pytest.raises(ValueError, match="'gpu:two' is not a GRES"):
        gres_device_files("gpu:two", {"gpu": "/dev/nvidia"})
