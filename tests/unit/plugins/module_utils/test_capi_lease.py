"""The Lease lock (module_utils/capi_lease.py) on a real kube-apiserver, the
Lease read back from the server: create, take over a lapsed holder, lose a race
with 409, renew, release, RBAC and a missing namespace. Each test's Lease is in a namespace of its own."""

import threading

import pytest

from conftest import ADMIN_TOKEN, READONLY_TOKEN

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (
    CapiApiError,
    CapiReader,
    build_configuration,
)
from ansible_collections.converged.hpc.plugins.module_utils.capi_lease import (
    LeaseHeld,
    LeaseLock,
    micro_time,
    parse_time,
    pid_alive,
    process_start,
)


class Clock:
    def __init__(self, now=1_800_000_000.0):
        self.now = now

    def __call__(self):
        return self.now


def reader(backend, token=ADMIN_TOKEN):
    configuration, headers = build_configuration(**backend.auth(token))
    return CapiReader(configuration, headers=headers)


@pytest.fixture
def ns(backend):
    backend.ns = backend.namespace()
    return backend.ns


def lock(backend, holder, clock=None, token=ADMIN_TOKEN, namespace=None, duration=30):
    clock = clock or Clock()
    return LeaseLock(reader(backend, token), namespace or backend.ns, "converged-hpc", holder, duration, clock=clock,
                     monotonic=clock)


def stored(backend, name="converged-hpc"):
    return backend.api().get("coordination.k8s.io/v1", "leases", backend.ns, name)


def test_micro_time_round_trip():
    assert micro_time(1_800_000_000.25) == "2027-01-15T08:00:00.250000Z"
    assert parse_time("2027-01-15T08:00:00.250000Z") == pytest.approx(1_800_000_000.25)
    assert parse_time("2027-01-15T08:00:00Z") == 1_800_000_000
    assert parse_time("garbage") is None and parse_time(None) is None
    # what other clients may write (the Python client's datetimes): any RFC 3339 offset
    assert parse_time("2027-01-15T08:00:00+00:00") == 1_800_000_000
    assert parse_time("2027-01-15T10:00:00.5+02:00") == pytest.approx(1_800_000_000.5)


def test_first_run_creates_the_lease(backend, ns):
    result = lock(backend, "run-a").acquire(timeout=0)
    assert result["acquired"] and result["previous_holder"] is None
    spec = stored(backend)["spec"]
    assert spec["holderIdentity"] == "run-a" and spec["leaseDurationSeconds"] == 30
    assert spec["leaseTransitions"] == 0 and spec["renewTime"].endswith("Z")


def test_a_held_lease_makes_the_other_wait_then_fail_naming_the_holder(backend, ns):
    clock = Clock()
    lock(backend, "run-a", clock).acquire(timeout=0)
    with pytest.raises(LeaseHeld) as exc:
        lock(backend, "run-b", clock).acquire(timeout=0, poll=0.01)
    assert "held by run-a" in str(exc.value) and exc.value.holder == "run-a"


def test_same_holder_renews(backend, ns):
    clock = Clock()
    a = lock(backend, "run-a", clock)
    a.acquire(timeout=0)
    first = stored(backend)["spec"]["renewTime"]
    clock.now += 10
    assert a.acquire(timeout=0)["previous_holder"] == "run-a"
    assert stored(backend)["spec"]["renewTime"] > first and stored(backend)["spec"]["leaseTransitions"] == 0


def test_a_lapsed_holder_is_taken_over(backend, ns):
    clock = Clock()
    lock(backend, "run-a", clock).acquire(timeout=0)
    clock.now += 31
    result = lock(backend, "run-b", clock).acquire(timeout=0)
    assert result["previous_holder"] == "run-a"
    spec = stored(backend)["spec"]
    assert spec["holderIdentity"] == "run-b" and spec["leaseTransitions"] == 1


def test_a_holder_whose_clock_runs_ahead_lapses_by_our_observation(backend, ns):
    ahead = Clock(1_800_000_000 + 3600)
    lock(backend, "run-a", ahead).acquire(timeout=0)
    ours = Clock()
    b = lock(backend, "run-b", ours)
    assert not b.try_acquire()[0]  # renewed "in an hour" by its clock
    ours.now += 31  # unchanged for longer than its duration, as we watched it
    assert b.try_acquire()[0]


def test_renew_keeps_it_and_stops_when_taken(backend, ns):
    clock = Clock()
    a = lock(backend, "run-a", clock)
    a.acquire(timeout=0)
    clock.now += 20
    assert a.renew()
    clock.now += 20  # 40 s after the take, 20 after the renewal: still a's
    assert not lock(backend, "run-b", clock).try_acquire()[0]
    clock.now += 31
    assert lock(backend, "run-b", clock).try_acquire()[0]
    assert not a.renew()  # somebody else's now: the renewer stops


def test_release_only_by_the_holder(backend, ns):
    a, b = lock(backend, "run-a"), lock(backend, "run-b")
    a.acquire(timeout=0)
    assert b.release() == (False, "run-a")
    assert stored(backend)["spec"]["holderIdentity"] == "run-a"
    assert a.release(check_mode=True) == (True, "run-a")
    assert stored(backend)["spec"]["holderIdentity"] == "run-a"
    assert a.release() == (True, "run-a")
    assert "holderIdentity" not in stored(backend)["spec"]
    assert b.acquire(timeout=0)["previous_holder"] is None


def test_check_mode_writes_nothing(backend, ns):
    result = lock(backend, "run-a").acquire(timeout=0, check_mode=True)
    assert result["acquired"]
    assert stored(backend) is None


def test_racing_runs_exactly_one_wins(backend, ns):
    winners, barrier = [], threading.Barrier(8)

    def run(name):
        one = lock(backend, name)
        barrier.wait()
        if one.try_acquire()[0]:
            winners.append(name)

    threads = [threading.Thread(target=run, args=("run-%d" % i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert stored(backend)["spec"]["holderIdentity"] == winners[0]


def test_stale_write_is_409_and_read_again(backend, ns):
    clock = Clock()
    a, b = lock(backend, "run-a", clock), lock(backend, "run-b", clock)
    a.acquire(timeout=0)
    a.release()
    original_read = b.read

    def read_then_a_takes_it():
        obj = original_read()  # b sees a free Lease...
        a.acquire(timeout=0)  # ...and a takes it before b writes
        return obj

    b.read = read_then_a_takes_it
    taken, _obj, _previous = b.try_acquire()
    assert not taken  # b's write carried the old resourceVersion: 409
    assert stored(backend)["spec"]["holderIdentity"] == "run-a"


def test_missing_namespace_is_named(backend, ns):
    with pytest.raises(CapiApiError, match="namespace hpc-ops does not exist"):
        lock(backend, "run-a", namespace="hpc-ops").acquire(timeout=0)


def test_no_rbac_for_leases_is_named(backend, ns):
    with pytest.raises(CapiApiError, match="get, create and update on leases.coordination.k8s.io"):
        lock(backend, "run-a", token=READONLY_TOKEN).acquire(timeout=0)


def test_a_zombie_or_a_reused_pid_is_not_the_run_alive():
    import os  # pylint: disable=import-outside-toplevel
    me = process_start(os.getpid())
    assert me and pid_alive(os.getpid(), me)
    assert not pid_alive(os.getpid(), str(int(me) + 1))  # the pid taken by another process since
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        for attempt in range(200):  # exited, not reaped yet: a zombie
            if process_start(child) is None:
                break
            threading.Event().wait(0.01)
        assert process_start(child) is None and not pid_alive(child)
    finally:
        os.waitpid(child, 0)
    assert not pid_alive(child)
