"""The event source (extensions/eda/plugins/event_source/capi_machines.py) against the simulator's
watch: the initial state, ADDED / MODIFIED / DELETED, coalescing, a 410 after /_sim/compact, a
dropped stream, and a bad start."""

import copy
import time

from conftest import ADMIN_TOKEN, a_machine, machines, reasons, run_source, set_phase

from ansible_collections.converged.hpc.extensions.eda.plugins.event_source import capi_machines as source
from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError


def patch_labels(sim, name, labels, namespace="metal3"):
    store = sim.store
    obj = copy.deepcopy(store.get(machines(sim), namespace, name))
    obj["metadata"]["labels"] = dict(obj["metadata"]["labels"], **labels)
    store.update(machines(sim), namespace, name, obj)


def args_for(sim, **extra):
    return dict({"host": sim.url, "api_key": ADMIN_TOKEN, "window": 0.5, "timeout": 5}, **extra)


def test_transitions():
    up = {"phase": "Provisioned", "deleting": False, "hooked": True, "node_type": "compute", "features": []}
    assert source.transition(None, up) == "up"
    assert source.transition(dict(up, phase="Provisioning"), up) == "up"
    assert source.transition(up, up) is None
    assert source.transition(up, dict(up, deleting=True)) == "deleting"
    assert source.transition(dict(up, deleting=True), dict(up, deleting=True)) is None
    assert source.transition(up, dict(up, deleting=True, hooked=False)) is None  # not ours to hold
    assert source.transition(up, dict(up, features=["feature.slurm.converged.hpc/gpu=true"])) == "relabelled"
    assert source.transition(up, dict(up, node_type="login")) == "relabelled"


def test_initial_state_then_coalesced_transitions(world):
    a_machine(world, "cn-1")
    a_machine(world, "ctl-1", node_type="controller", phase="Running")
    a_machine(world, "cn-9", phase="Provisioning")  # not up yet: not in the initial state
    thread, out, _res = run_source(args_for(world), lambda ev: len(ev) >= 3)
    deadline = time.monotonic() + 10
    while not out.events and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reasons(out.events[:1]) == [(["initial"], ["cn-1", "ctl-1"])]
    for i in range(2, 7):  # a burst: five new Machines come up -> one event
        a_machine(world, "cn-%d" % i)
    set_phase(world, "cn-9", "Provisioned")
    time.sleep(1.5)
    world.store.delete(machines(world), "metal3", "cn-1")  # its finalizer keeps it: deletionTimestamp
    patch_labels(world, "cn-2", {"feature.slurm.converged.hpc/gpu": "true"})
    thread.join(30)
    assert reasons(out.events[1:3]) == [(["up"], ["cn-2", "cn-3", "cn-4", "cn-5", "cn-6", "cn-9"]),
                                        (["deleting", "relabelled"], ["cn-1", "cn-2"])]
    machine = out.events[1]["capi_machines"]["machines"][0]
    assert set(machine) == {"namespace", "name", "resourceVersion", "reason", "phase", "node_type"}
    rvs = [int(e["capi_machines"]["resourceVersion"]) for e in out.events[1:3]]
    assert rvs[1] > rvs[0]


def test_410_lists_again_and_nothing_is_missed(world):
    a_machine(world, "cn-1")
    thread, out, _res = run_source(args_for(world), lambda ev: len(ev) >= 2)
    time.sleep(1.5)
    world.store.compact()  # the watch's resourceVersion is gone: the server answers 410
    a_machine(world, "cn-2")
    thread.join(30)
    assert reasons(out.events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])]


def test_a_dropped_stream_resumes_from_its_resource_version(world):
    a_machine(world, "cn-1")
    thread, out, _res = run_source(args_for(world, timeout=1), lambda ev: len(ev) >= 2)
    time.sleep(2.5)  # the server ended the first watch (timeoutSeconds=1): the source watched again
    a_machine(world, "cn-2")
    thread.join(30)
    assert reasons(out.events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])]


def test_namespaces_and_clusters_are_sent(world):
    world.store.create(world.store.resource("", "namespaces"), None,
                       {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    a_machine(world, "cn-1")
    a_machine(world, "cn-x", namespace="other")
    thread, out, _res = run_source(args_for(world, namespaces=["metal3"], clusters=["hpc"]), lambda ev: len(ev) >= 1)
    thread.join(30)
    assert reasons(out.events) == [(["initial"], ["cn-1"])]


def test_a_bad_start_is_one_clear_line(world, tmp_path):
    thread, _out, res = run_source({"host": world.url, "api_key": "wrong"}, lambda ev: False, timeout=5)
    thread.join(30)
    assert isinstance(res["error"], CapiApiError)
    assert "cannot start" in str(res["error"]) and "401" in str(res["error"]) and "wrong" not in str(res["error"])
    thread, _out, res = run_source({"kubeconfig": str(tmp_path / "nope")}, lambda ev: False, timeout=5)
    thread.join(30)
    assert "kubeconfig %s does not exist" % (tmp_path / "nope") in str(res["error"])
