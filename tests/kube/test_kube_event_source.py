"""The event source (extensions/eda/plugins/event_source/capi_machines.py) against a real kube-apiserver:
the initial list, a burst coalesced, deleting, relabelled, a watch the server ends and its resume, a
410 after kube-apiserver restarts (its new watch cache no longer holds the source's resourceVersion),
a wrong token, a missing kubeconfig, a token that may only read Machines, only the namespaces and
clusters asked, and the state emitted again after resync seconds with no event."""

import time

import pytest

from conftest import ADMIN_TOKEN, READONLY_TOKEN, make_machine, reasons, run_source, set_machine_phase
from kubeapi import KubeApiServer

from ansible_collections.converged.hpc.extensions.eda.plugins.event_source import capi_machines as source
from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError

API = "cluster.x-k8s.io/v1beta2"
API_MACHINES = "/apis/cluster.x-k8s.io/v1beta2/namespaces/%s/machines"


def args_for(server, ns, token=ADMIN_TOKEN, **extra):
    return dict({"host": server.url, "api_key": token, "ca_cert": server.ca_cert, "namespaces": [ns],
                 "window": 0.5, "timeout": 5}, **extra)


def first_event(out, seconds=15):
    deadline = time.monotonic() + seconds
    while not out.events and time.monotonic() < deadline:
        time.sleep(0.05)
    return out.events[:1]


def test_initial_state_then_coalesced_transitions(kube, kube_ns):
    api = kube.api()
    make_machine(api, kube_ns, "cn-1")
    make_machine(api, kube_ns, "ctl-1", node_type="controller", phase="Running")
    make_machine(api, kube_ns, "cn-9", phase="Provisioning")  # not up yet: not in the initial state
    # a window of 2 s: the burst's six writes take well under it, on a loaded machine too (0.5 s was not)
    thread, out, res = run_source(args_for(kube, kube_ns, window=2.0), lambda ev: len(ev) >= 3, timeout=40)
    assert reasons(first_event(out)) == [(["initial"], ["cn-1", "ctl-1"])], res
    for i in range(2, 7):  # a burst: five new Machines come up -> one event
        make_machine(api, kube_ns, "cn-%d" % i)
    set_machine_phase(api, kube_ns, "cn-9", "Provisioned")
    time.sleep(3.0)  # past the window: what comes next is another event
    api.delete(API, "machines", kube_ns, "cn-1")  # its finalizer keeps it: deletionTimestamp
    api.patch(API, "machines", kube_ns, "cn-2", {"metadata": {"labels": {"feature.slurm.converged.hpc/gpu": "true"}}})
    thread.join(40)
    assert reasons(out.events[1:3]) == [(["up"], ["cn-2", "cn-3", "cn-4", "cn-5", "cn-6", "cn-9"]),
                                        (["deleting", "relabelled"], ["cn-1", "cn-2"])], res
    rvs = [int(e["capi_machines"]["resourceVersion"]) for e in out.events[1:3]]
    assert rvs[1] > rvs[0]


def test_a_watch_the_server_ends_is_resumed(kube, kube_ns):
    api = kube.api()
    make_machine(api, kube_ns, "cn-1")
    thread, out, res = run_source(args_for(kube, kube_ns, timeout=1), lambda ev: len(ev) >= 2, timeout=40)
    assert first_event(out)
    time.sleep(2.5)  # the server ended the first watch (timeoutSeconds=1): the source watched again
    make_machine(api, kube_ns, "cn-2")
    thread.join(40)
    assert reasons(out.events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])], res


def test_a_token_that_may_only_read_machines_is_enough(kube, kube_ns):
    api = kube.api()
    make_machine(api, kube_ns, "cn-1")
    thread, out, res = run_source(args_for(kube, kube_ns, READONLY_TOKEN), lambda ev: len(ev) >= 2, timeout=40)
    assert first_event(out)
    make_machine(api, kube_ns, "cn-2")
    thread.join(40)
    assert reasons(out.events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])], res


def test_a_wrong_token_is_one_clear_line(kube, kube_ns):
    thread, _out, res = run_source(args_for(kube, kube_ns, "wrong-token"), lambda ev: False, timeout=10)
    thread.join(30)
    assert isinstance(res["error"], CapiApiError)
    message = str(res["error"])
    assert "cannot start" in message and "401" in message and "wrong-token" not in message


def test_a_missing_kubeconfig_is_named(tmp_path):
    thread, _out, res = run_source({"kubeconfig": str(tmp_path / "nope")}, lambda ev: False, timeout=5)
    thread.join(30)
    assert "kubeconfig %s does not exist" % (tmp_path / "nope") in str(res["error"])


def test_only_the_namespaces_and_clusters_asked_are_followed(kube, kube_ns):
    api, other_ns = kube.api(), kube_ns + "-other"
    api.namespace(other_ns)
    make_machine(api, kube_ns, "cn-1")
    make_machine(api, kube_ns, "cn-y", cluster="other")
    make_machine(api, other_ns, "cn-x")
    thread, out, res = run_source(args_for(kube, kube_ns, clusters=["hpc"]), lambda ev: len(ev) >= 1, timeout=40)
    thread.join(40)
    assert reasons(out.events) == [(["initial"], ["cn-1"])], res


@pytest.fixture
def own_server(tmp_path):
    """A kube-apiserver of the test's own (it is restarted)."""
    server = KubeApiServer(tmp_path / "apiserver").start()
    server.api().namespace("metal3")
    yield server
    server.stop()


def test_a_410_after_the_server_restarts_lists_again_and_misses_nothing(own_server, monkeypatch):
    server, api = own_server, own_server.api()
    make_machine(api, "metal3", "cn-1")
    lists = []
    relist = source.Watcher.relist

    def counted(self):
        relist(self)
        lists.append(self.rv)

    monkeypatch.setattr(source.Watcher, "relist", counted)
    thread, out, res = run_source(args_for(server, "metal3", clusters=["hpc"], timeout=30),
                                  lambda ev: len(ev) >= 2, timeout=90)
    assert reasons(first_event(out)) == [(["initial"], ["cn-1"])]
    watched_from = lists[0]
    # Machines of another cluster move the resourceVersion on; the source's watch (cluster hpc) sees none
    for i in range(3):
        make_machine(api, "metal3", "other-%d" % i, cluster="other")
    server.restart_apiserver()
    make_machine(api, "metal3", "cn-2")
    thread.join(90)
    assert reasons(out.events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])], res
    assert len(lists) == 2, "the source did not list again after the restart: %s" % lists
    # what the source met: its resourceVersion is older than the new watch cache
    status, body = api.request("GET", API_MACHINES % "metal3", query={
        "watch": "1", "resourceVersion": watched_from, "timeoutSeconds": "1"}, raw=True)
    assert status == 200 and b'"code":410' in body, body[:300]


def test_quiet_for_resync_seconds_the_state_is_emitted_again(kube, kube_ns):
    # a reconcile that failed (the API or Slurm away) runs again though no Machine changed: after resync
    # seconds with no event, the state as at start (Machines up, those being deleted that hold our hook)
    api = kube.api()
    make_machine(api, kube_ns, "cn-1")
    make_machine(api, kube_ns, "cn-9", phase="Provisioning")  # not up: in neither
    thread, out, res = run_source(args_for(kube, kube_ns, resync=2), lambda ev: len(ev) >= 3, timeout=40)
    thread.join(40)
    assert reasons(out.events[:3]) == [(["initial"], ["cn-1"]), (["resync"], ["cn-1"]), (["resync"], ["cn-1"])], res
    assert {m["reason"] for e in out.events[1:3] for m in e["capi_machines"]["machines"]} == {"resync"}
    gaps = [b["capi_machines"]["at"] - a["capi_machines"]["at"] for a, b in zip(out.events, out.events[1:3])]
    assert all(g >= 1.9 for g in gaps), gaps


def test_a_bad_resync_is_named(kube, kube_ns):
    for bad in ("soon", -5):
        thread, out, res = run_source(args_for(kube, kube_ns, resync=bad), lambda ev: False, timeout=10)
        thread.join(20)
        assert not out.events and "resync=%r" % (bad,) in str(res.get("error")), res
