"""The collection's own Kubernetes roles (rbac/*.yml), each part run with a token that has exactly its role on
a real kube-apiserver, what it was answered read from the server's audit log: no request refused (a 403 is
a bug in the role or in the collection), and every rule of the role used by some request (a verb nothing
uses is one a site grants for nothing).

rbac/inventory.yml (converged-hpc-inventory): the inventory plugin, its Metal3 hosts included
(metal3=always), and the event source, its list and its watch."""

import json
import subprocess
import time

import pytest
import yaml

import kubeapi
from conftest import INVENTORY_TOKEN, ansible_env, make_machine, reasons, recorded, run_source


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if kubeapi.assets()[1]:
        pytest.skip("real kube-apiserver tier skipped: " + kubeapi.assets()[1])
    with recorded(tmp_path_factory.mktemp("rbac-apiserver"), audit=True) as started:
        yield started


def rule_grants(rules):
    """Each (verb, API group, resource) a role's rules grant."""
    return {(verb, group, resource) for rule in rules for verb in rule["verbs"] for group in rule["apiGroups"]
            for resource in rule["resources"]}


@pytest.fixture(scope="module")
def inventory_part(server, tmp_path_factory):
    """The inventory (every namespace, the hosts required) and the event source (one namespace: its list,
    then a Machine that comes up seen through its watch), both with the inventory role's token."""
    tmp = tmp_path_factory.mktemp("inventory-part")
    config = tmp / "mgmt.capi_machines.yml"
    config.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "host": server.url,
                                      "api_key": INVENTORY_TOKEN, "ca_cert": server.ca_cert, "metal3": "always"}))
    listed = subprocess.run(["ansible-inventory", "-i", str(config), "--list"], capture_output=True, text=True,
                            env=ansible_env(), cwd=str(tmp), timeout=120, check=False)
    api = server.api()
    api.namespace("rbac-events")
    make_machine(api, "rbac-events", "cn-1")
    args = {"host": server.url, "api_key": INVENTORY_TOKEN, "ca_cert": server.ca_cert,
            "namespaces": ["rbac-events"], "window": 0.5, "timeout": 5}
    thread, out, result = run_source(args, lambda ev: len(ev) >= 2, timeout=40)
    deadline = time.monotonic() + 15
    while not out.events and time.monotonic() < deadline:
        time.sleep(0.05)
    make_machine(api, "rbac-events", "cn-2")
    thread.join(40)
    user = kubeapi.ROLES[INVENTORY_TOKEN][0]
    # a watch is logged when it ends (the source's was cut when it stopped): a moment for the last entry
    deadline = time.monotonic() + 15
    while not any(entry[0] == "watch" for entry in server.answered(user)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return listed, out.events, result, server.answered(user)


def test_the_inventory_lists_every_machine_and_its_host_with_the_inventory_role(inventory_part):
    listed, _events, _result, _answered = inventory_part
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "403" not in listed.stderr and INVENTORY_TOKEN not in listed.stdout + listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert hostvars and all("capi" in v for v in hostvars.values())
    # the Metal3 hosts were read (metal3=always fails the run when it cannot): their memory is on the hosts
    assert any(v["capi"].get("ram_mib") for v in hostvars.values()), listed.stdout[:2000]


def test_the_event_source_lists_then_watches_with_the_inventory_role(inventory_part):
    _listed, events, result, _answered = inventory_part
    assert reasons(events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])], result


def test_the_inventory_role_is_all_used_and_never_refused(inventory_part):
    _listed, _events, _result, answered = inventory_part
    refused = sorted({(verb, group, resource, code) for verb, group, resource, code in answered if code >= 400})
    assert not refused, "refused with the collection's role converged-hpc-inventory: %s" % refused
    used = {(verb, group, resource) for verb, group, resource, _code in answered}
    unused = rule_grants(kubeapi.collection_role("inventory")) - used
    assert not unused, "granted by rbac/inventory.yml but used by no request: %s" % sorted(unused)
