"""Machines only (metal3: never): the plugin adds each page's hosts while the server writes the next.

Whatever happens, the inventory is the one mapping the whole list gives (the same plugin reading two
namespaces, two lists, maps them whole); a list that fails leaves no host behind. Each inventory is
built in a Python of its own (Ansible's collection loader must come before any import of the
collection, which this test process has made). On a real kube-apiserver of the module's own, holding
the recorded objects only (the plugin lists every namespace); a list that starts again is a real 410: its
continue token outlived by an etcd compaction and a kube-apiserver restart."""

import copy
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from conftest import ADMIN_TOKEN, CAPI_G, CAPI_V, COLLECTIONS

DRIVER = r"""
import json, os, sys, time
from ansible.plugins.loader import init_plugin_loader
init_plugin_loader([sys.argv[1]])
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible_collections.converged.hpc.plugins.inventory import capi_machines
from ansible_collections.converged.hpc.plugins.module_utils import capi_client

source, mode, handshake = sys.argv[2], sys.argv[3], sys.argv[4]
seen = {"pages": 0, "finished": []}
finish, request = capi_machines._Stream.finish, capi_client.CapiReader.request
add_hosts = capi_machines.InventoryModule._add_hosts


def counting_add_hosts(self, hosts, groups):
    seen["pages"] += 1  # a page's hosts; or all of them, once, when they are added from the whole list
    return add_hosts(self, hosts, groups)


def recording_finish(self, objects):
    out = finish(self, objects)
    seen["finished"].append(out is not None)
    return out


continues = []


def faulty_request(self, path, query=None, **kwargs):
    if query and query.get("continue"):
        continues.append(True)
        if mode == "restart" and len(continues) == 2:
            # the test compacts etcd and restarts kube-apiserver meanwhile: this page's token has expired (410)
            open(handshake + "/paused", "w").close()
            while not os.path.exists(handshake + "/resumed"):
                time.sleep(0.1)
        if mode == "fail" and len(continues) >= 3:
            return 500, b'{"kind":"Status","apiVersion":"v1","status":"Failure","message":"etcd timed out","code":500}'
    return request(self, path, query, **kwargs)


capi_machines.InventoryModule._add_hosts = counting_add_hosts
capi_machines._Stream.finish = recording_finish
capi_client.CapiReader.request = faulty_request
inv = InventoryManager(loader=DataLoader(), sources=[source])._inventory
hosts = {name: {k: v for k, v in host.vars.items() if k not in ("inventory_file", "inventory_dir")}
         for name, host in inv.hosts.items()}
groups = {name: [h.name for h in group.hosts] for name, group in inv.groups.items()}
json.dump({"hosts": hosts, "groups": groups, "seen": seen}, sys.stdout)
"""


@pytest.fixture
def server(recorded_server):
    return recorded_server


@pytest.fixture
def added(server):
    """Machines a test adds (namespace, name): deleted after it."""
    names = []
    yield names
    for namespace, name in names:
        server.api().delete(CAPI_G + "/" + CAPI_V, "machines", namespace, name)


def inventory(server, tmp_path, mode="", **options):
    """(hosts with their variables, groups with their hosts in order, what the stream did)."""
    config = dict({"plugin": "converged.hpc.capi_machines", "host": server.url, "api_key": ADMIN_TOKEN,
                   "ca_cert": server.ca_cert, "metal3": "never", "page_size": 2}, **options)
    path = os.path.join(str(tmp_path), "%d.capi_machines.yml" % len(os.listdir(str(tmp_path))))
    with open(path, "w") as fh:
        yaml.safe_dump(config, fh)
    # a source that fails is only a warning (Ansible's default; this repository's ansible.cfg makes it an error):
    # the run goes on with what the source left
    env = dict(os.environ, ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="false", ANSIBLE_INVENTORY_ENABLED=config["plugin"])
    handshake = str(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, COLLECTIONS, path, mode, handshake],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if mode == "restart":
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(handshake, "paused")) and proc.poll() is None:
            assert time.monotonic() < deadline, "the list never reached its second continue"
            time.sleep(0.1)
        server.compact()
        server.restart_apiserver()
        open(os.path.join(handshake, "resumed"), "w").close()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    out = json.loads(stdout)
    if mode == "fail":
        assert "etcd timed out" in " ".join(stderr.split()), stderr  # (wrapped before ansible-core 2.19)
    return out["hosts"], out["groups"], out["seen"]


def whole(server, tmp_path, **options):
    """The reference: two namespaces, two lists, mapped whole at the end."""
    hosts, groups, seen = inventory(server, tmp_path, namespaces=["lab2", "metal3"], **options)
    assert seen == {"pages": 1, "finished": []}
    return hosts, groups


def add_machine(server, added, name, namespace, address, deployment=None):
    api = server.api()
    template = next(m for m in api.list(CAPI_G + "/" + CAPI_V, "machines", "metal3")
                    if m["metadata"]["name"].startswith("hpc-c"))
    obj = copy.deepcopy(template)
    labels = dict(obj["metadata"]["labels"])
    if deployment:
        labels["cluster.x-k8s.io/deployment-name"] = deployment
    obj["metadata"] = {"name": name, "namespace": namespace, "labels": labels}
    obj.pop("status", None)
    api.create(obj, "capi-controller-manager")
    added.append((namespace, name))
    api.patch(CAPI_G + "/" + CAPI_V, "machines", namespace, name,
              {"status": {"phase": "Provisioned", "addresses": [{"type": "InternalIP", "address": address}]}}, sub="status")


def test_pages_added_as_they_come_give_the_whole_lists_inventory(server, tmp_path):
    options = {"compose": {"cores": "capi.name | length"}, "keyed_groups": [{"key": "capi.namespace", "prefix": "ns"}]}
    hosts, groups, seen = inventory(server, tmp_path, **options)
    assert seen["pages"] >= 5 and seen["finished"] == [True]  # 10 Machines, 2 a page
    assert (hosts, groups) == whole(server, tmp_path, **options)
    # (a composed value is the text "26" before ansible-core 2.19, which keeps Jinja's native types)
    assert int(hosts["hpc-controller-5c6b9-x7k2p"]["cores"]) == 26
    assert "hpc-controller-5c6b9-x7k2p" in groups["ns_metal3"]


def test_a_name_two_machines_want_is_mapped_from_the_whole_list(server, added, tmp_path):
    # a newer Machine of an existing host's name, on an earlier page (lab2 sorts before metal3): the
    # older keeps the name, on whatever page it comes
    add_machine(server, added, "hpc-controller-5c6b9-x7k2p", "lab2", "10.9.9.9")
    hosts, groups, seen = inventory(server, tmp_path)
    assert seen["pages"] >= 3 and seen["finished"] == [False]
    assert (hosts, groups) == whole(server, tmp_path)
    assert hosts["lab2_hpc-controller-5c6b9-x7k2p"]["ansible_host"] == "10.9.9.9"
    assert hosts["hpc-controller-5c6b9-x7k2p"]["capi"]["namespace"] == "metal3"


def test_a_machine_deployment_name_in_two_namespaces_is_mapped_from_the_whole_list(server, added, tmp_path):
    add_machine(server, added, "other-1", "lab2", "10.9.9.8", deployment="hpc-compute")
    hosts, groups, seen = inventory(server, tmp_path)
    assert seen["finished"] == [False]
    assert (hosts, groups) == whole(server, tmp_path)
    assert "capi_md_hpc_compute" not in groups
    assert groups["capi_md_lab2_hpc_compute"] == ["other-1"] and groups["capi_md_metal3_hpc_compute"]


def test_a_list_that_starts_again_is_mapped_whole(server, tmp_path):
    hosts, groups, seen = inventory(server, tmp_path, mode="restart")
    assert seen["pages"] >= 3 and seen["finished"] == [False]
    assert (hosts, groups) == whole(server, tmp_path)


def test_a_list_that_fails_half_way_leaves_no_host(server, tmp_path):
    hosts, groups, seen = inventory(server, tmp_path, mode="fail")
    assert seen["pages"] >= 2  # hosts were added, then the list failed
    assert hosts == {} and [g for g in groups if g not in ("all", "ungrouped")] == []
