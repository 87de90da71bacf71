"""The lab's host agent looks at its machines (podman) at most once a tick, and only when a host may need it.

Each tick lists the BareMetalHosts; a `podman inspect` for every host every second cost a lab of eight
hosts about a third of a CPU, beside the labs CI runs at once. Here the agent's API and podman are stand-ins
that count: the real agent on the real controllers runs in tests/kube/test_controllers.py and every lab.
"""

import os
import time
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "lab"))
import hostagent  # noqa: E402  pylint: disable=wrong-import-position


def host(name, state, online=True, consumer=None):
    spec = {"online": online}
    if consumer:
        spec.update(consumerRef={"name": consumer}, image={"url": "http://images.lab.invalid/compute.qcow2"})
    return {"metadata": {"name": name}, "spec": spec, "status": {"provisioning": {"state": state}}}


class Api:
    def __init__(self, hosts):
        self.hosts = hosts

    def list(self, *_):
        return self.hosts


@pytest.fixture
def agent(tmp_path, monkeypatch):
    calls = {"ps": 0, "run": []}
    states = {}

    def container_states():
        calls["ps"] += 1
        return dict(states)

    def run(args, **_):
        calls["run"].append(args)

        class Done:
            returncode, stdout, stderr = 0, "", ""
        return Done()

    class Thread:  # the agent's work threads, run at once: each tick's outcome is known when it returns
        def __init__(self, target, args, **_):
            self.go = lambda: target(*args)

        def start(self):
            self.go()

    monkeypatch.setattr(hostagent.subprocess, "run", run)
    monkeypatch.setattr(hostagent.threading, "Thread", Thread)
    made = hostagent.Agent(Api([]), "metal3", str(tmp_path), "machines")
    monkeypatch.setattr(made, "container_states", container_states)
    monkeypatch.setattr(made, "remove", lambda name, why: (made.busy.discard(name), states.pop(name, None)))
    return made, calls, states


def test_running_hosts_that_are_on_are_not_looked_at(agent):
    made, calls, states = agent
    made.api.hosts = [host("h%d" % i, "provisioned", consumer="m%d" % i) for i in range(8)]
    for i in range(8):
        made.booted["h%d" % i] = "m%d http://images.lab.invalid/compute.qcow2" % i
        states["h%d" % i] = "running"
    for _tick in range(5):
        made.tick()
    assert calls["ps"] == 0 and calls["run"] == []


def test_a_host_powered_off_is_stopped_once_and_started_when_on_again(agent):
    made, calls, states = agent
    off = host("h1", "provisioned", online=False, consumer="m1")
    made.api.hosts = [off, host("h2", "provisioned", consumer="m2")]
    made.booted.update({"h1": "m1 http://images.lab.invalid/compute.qcow2",
                        "h2": "m2 http://images.lab.invalid/compute.qcow2"})
    states.update(h1="running", h2="running")
    made.tick()
    assert calls["ps"] == 1 and calls["run"] == [["podman", "stop", "-t", "5", "h1"]]
    states["h1"] = "exited"
    made.tick()
    made.tick()
    assert calls["ps"] == 1 and len(calls["run"]) == 1  # off and stopped by us: nothing to look at
    off["spec"]["online"] = True
    made.tick()
    assert calls["ps"] == 2 and calls["run"][-1] == ["podman", "start", "h1"]
    states["h1"] = "running"
    made.tick()
    assert calls["ps"] == 2 and len(calls["run"]) == 2


def test_hosts_given_back_are_looked_at_once_and_a_machine_left_on_one_is_removed(agent):
    made, calls, states = agent
    made.api.hosts = [host("h%d" % i, "available") for i in range(6)]
    states["h3"] = "running"  # a machine an earlier agent booted, its record lost
    made.tick()  # h3's machine removed; the five others known to have none
    assert calls["ps"] == 1 and "h3" not in states and made.absent == {"h0", "h1", "h2", "h4", "h5"}
    made.tick()  # h3 looked at once more: gone
    made.tick()
    made.tick()
    assert calls["ps"] == 2 and made.absent == {"h%d" % i for i in range(6)}


def saved(seconds_ago):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))


def test_a_host_the_operator_left_in_a_moving_state_is_nudged_once_per_stall(agent):
    # the Bare Metal Operator's requeue backoff may leave a host in provisioning for minutes (docs/lab.md):
    # an annotation changed on it brings it back; not a host saved moments ago, one at rest, or a paused one
    made, _calls, _states = agent
    patches = []
    made.api.patch = lambda *args, **_: patches.append(args)
    stalled = host("h1", "provisioning", consumer="m1")
    stalled["status"]["lastUpdated"] = saved(95)
    fresh = host("h2", "provisioning", consumer="m2")
    fresh["status"]["lastUpdated"] = saved(3)
    rest = host("h3", "provisioned", consumer="m3")
    rest["status"]["lastUpdated"] = saved(600)
    paused = host("h4", "deprovisioning")
    paused["status"]["lastUpdated"] = saved(600)
    paused["metadata"]["annotations"] = {hostagent.PAUSED: "someone"}
    for h in (stalled, fresh, rest, paused):
        made.booted[h["metadata"]["name"]] = "%s http://images.lab.invalid/compute.qcow2" % (
            (h["spec"].get("consumerRef") or {}).get("name"))
    made.api.hosts = [stalled, fresh, rest, paused]
    made.tick()
    made.tick()  # not again within STALL_SECONDS
    nudges = [p for p in patches if hostagent.NUDGED in p[4]["metadata"].get("annotations", {})]
    assert [p[3] for p in nudges] == ["h1"]
    made.nudged["h1"] -= hostagent.STALL_SECONDS  # a stall later, still not saved: again
    made.tick()
    nudges = [p for p in patches if hostagent.NUDGED in p[4]["metadata"].get("annotations", {})]
    assert [p[3] for p in nudges] == ["h1", "h1"]
