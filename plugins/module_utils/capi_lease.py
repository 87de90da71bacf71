# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A Kubernetes Lease (coordination.k8s.io/v1) used as a lock between runs.

API access only; the module (plugins/modules/lease.py), its action plugin (plugins/action/lease.py: the
same work in the controller's process when the task runs there) and the tests use it.
Every write carries the resourceVersion it was computed from, so two runs
racing for the same Lease cannot both win: the loser gets 409 and reads again.
A Lease is free when it has no holder or its holder stopped renewing it:
renewTime + leaseDurationSeconds is past by our clock, or (clock skew between
hosts) we have watched its resourceVersion stay the same for longer than
leaseDurationSeconds.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import calendar
import json
import os
import re
import socket
import time

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError, _status_message
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import api_task, with_auth

GROUP_VERSION = "coordination.k8s.io/v1"


def micro_time(epoch):
    """Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + ".%06dZ" % int((epoch % 1) * 1e6)


_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?$")


def parse_time(text):
    """Seconds since the epoch of a Kubernetes Time or MicroTime (any RFC 3339 offset), None when absent or
    unreadable."""
    found = _TIME.match(str(text or "").strip())
    if not found:
        return None
    try:
        epoch = calendar.timegm(time.strptime(found.group(1), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    epoch += float("0." + found.group(2)) if found.group(2) else 0.0
    zone = found.group(3)
    if zone and zone != "Z":
        hours, minutes = int(zone[1:3]), int(zone[-2:])
        epoch -= (1 if zone[0] == "+" else -1) * (hours * 3600 + minutes * 60)
    return epoch


class LeaseLock:
    """One Lease in one namespace, taken and given back by one holder."""

    def __init__(self, reader, namespace, name, holder, duration=60, clock=time.time, monotonic=time.monotonic):
        self.reader, self.namespace, self.name, self.holder = reader, namespace, name, holder
        self.duration = int(duration)
        self.clock, self.monotonic = clock, monotonic
        self.collection = "/apis/%s/namespaces/%s/leases" % (GROUP_VERSION, namespace)
        self.path = "%s/%s" % (self.collection, name)
        self._seen = (None, None)  # (resourceVersion, monotonic time first seen)

    # ------------------------------------------------------------ API
    def _call(self, method, path, body=None):
        status, data = self.reader.request(path, method=method, body=body)
        if status in (401, 403):
            raise CapiApiError("the Kubernetes API at %s refused to %s Lease %s/%s (%s): the account needs get, "
                               "create and update on leases.coordination.k8s.io in namespace %s"
                               % (self.reader.host, {"GET": "read", "POST": "create", "PUT": "update"}[method],
                                  self.namespace, self.name, status, self.namespace))
        if status == 404 and method == "POST":
            raise CapiApiError("cannot create Lease %s/%s: namespace %s does not exist (%s)"
                               % (self.namespace, self.name, self.namespace, _status_message(data)))
        if status not in (200, 201, 404, 409):
            raise CapiApiError("%s Lease %s/%s at %s failed with HTTP %s: %s" % (
                method, self.namespace, self.name, self.reader.host, status, _status_message(data)))
        try:
            return status, json.loads(data) if data else {}
        except ValueError:
            raise CapiApiError("the Kubernetes API at %s answered %s Lease %s/%s with something that is not JSON"
                               % (self.reader.host, method, self.namespace, self.name))

    def read(self):
        """The Lease object, or None when there is none."""
        status, obj = self._call("GET", self.path)
        return None if status == 404 else obj

    # ------------------------------------------------------------ judging
    def expires(self, obj):
        """Epoch seconds at which the holder's claim lapses (None: no holder, or no readable renewal time - then
        only this module's own observation of the resourceVersion can free it)."""
        spec = obj.get("spec") or {}
        if not spec.get("holderIdentity"):
            return None
        renewed = parse_time(spec.get("renewTime") or spec.get("acquireTime"))
        if renewed is None:
            return None
        return renewed + int(spec.get("leaseDurationSeconds") or self.duration)

    def is_free(self, obj):
        spec = (obj or {}).get("spec") or {}
        if obj is None or not spec.get("holderIdentity") or spec["holderIdentity"] == self.holder:
            return True
        expires = self.expires(obj)
        if expires is not None and self.clock() > expires:
            return True
        # our own observation, immune to clock skew: unchanged for longer than the duration
        rv = obj["metadata"].get("resourceVersion")
        if self._seen[0] != rv:
            self._seen = (rv, self.monotonic())
        return self.monotonic() - self._seen[1] > int(spec.get("leaseDurationSeconds") or self.duration)

    def _spec(self, obj, now):
        spec = dict((obj or {}).get("spec") or {})
        ours = spec.get("holderIdentity") == self.holder
        if not ours:
            spec["acquireTime"] = micro_time(now)
            if spec.get("holderIdentity"):
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            else:
                spec.setdefault("leaseTransitions", 0)
        spec.update(holderIdentity=self.holder, leaseDurationSeconds=self.duration, renewTime=micro_time(now))
        return spec

    # ------------------------------------------------------------ acting
    def try_acquire(self, check_mode=False):
        """One attempt: (taken, lease object, previous holder). A lost race reads again next time."""
        obj = self.read()
        previous = ((obj or {}).get("spec") or {}).get("holderIdentity") or None
        if not self.is_free(obj):
            return False, obj, previous
        if check_mode:
            return True, obj, previous
        now = self.clock()
        if obj is None:
            body = {"apiVersion": GROUP_VERSION, "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {"app.kubernetes.io/managed-by": "converged.hpc"}},
                    "spec": self._spec(None, now)}
            status, new = self._call("POST", self.collection, body)
        else:
            body = dict(obj, spec=self._spec(obj, now))
            status, new = self._call("PUT", self.path, body)
        if status == 409 or status == 404:  # somebody else wrote it first, or it went away: read again
            return False, obj, previous
        return True, new, previous

    def acquire(self, timeout=1800, poll=2.0, check_mode=False):
        """Take the Lease, waiting at most timeout seconds for its holder. Returns a result dict."""
        start = self.monotonic()
        while True:
            taken, obj, previous = self.try_acquire(check_mode)
            if taken:
                return {"acquired": True, "previous_holder": previous, "lease": obj,
                        "waited": round(self.monotonic() - start, 1),
                        "changed": True}
            if check_mode or self.monotonic() - start >= timeout:
                spec = (obj or {}).get("spec") or {}
                expires = self.expires(obj) if obj else None
                raise LeaseHeld(
                    "Lease %s/%s is held by %s (renewed %s, lapses %s unless renewed)%s" % (
                        self.namespace, self.name, spec.get("holderIdentity"), spec.get("renewTime"),
                        micro_time(expires) if expires else "?",
                        "" if check_mode else ": waited %d s" % timeout), spec.get("holderIdentity"))
            time.sleep(poll)

    def renew(self):
        """Renew the Lease while it is ours; False once it is not (released, or taken after lapsing)."""
        for _attempt in range(3):
            obj = self.read()
            if obj is None or ((obj.get("spec") or {}).get("holderIdentity")) != self.holder:
                return False
            status, _new = self._call("PUT", self.path, dict(obj, spec=self._spec(obj, self.clock())))
            if status in (200, 201):
                return True
        return True  # three lost races in a row: still ours as far as we know; try again next time

    def release(self, check_mode=False):
        """Give the Lease back when it is ours. Returns (changed, holder found)."""
        for _attempt in range(5):
            obj = self.read()
            holder = ((obj or {}).get("spec") or {}).get("holderIdentity")
            if obj is None or holder != self.holder:
                return False, holder
            if check_mode:
                return True, holder
            spec = {k: v for k, v in obj["spec"].items() if k not in ("holderIdentity", "acquireTime")}
            status, _new = self._call("PUT", self.path, dict(obj, spec=spec))
            if status in (200, 201):
                return True, holder
        raise CapiApiError("could not release Lease %s/%s: it kept changing under us" % (self.namespace, self.name))


class LeaseHeld(Exception):
    def __init__(self, message, holder):
        super().__init__(message)
        self.holder = holder


def process_start(pid):
    """When process pid started (clock ticks since boot, from /proc), or None when it is gone or has exited and
    waits to be reaped (a zombie: its parent has not collected it yet). "" where /proc cannot tell."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            fields = fh.read().rpartition(")")[2].split()
    except FileNotFoundError:
        return None
    except OSError:
        return ""
    if not fields or fields[0] in ("Z", "X", "x"):
        return None
    return fields[19] if len(fields) > 19 else ""


def pid_alive(pid, started=None):
    """Whether the run's process still runs: not gone, not a zombie (an exited ansible-playbook its parent has
    not reaped yet answers kill(pid, 0) as if it ran), and not another process that took its pid (started:
    process_start's value when the run was seen alive)."""
    start = process_start(pid)
    if start is None:
        return False
    if start and started and start != started:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def keep_renewed(lock, pid, interval):
    """Renew the Lease from a detached process while process pid lives and the Lease is ours.

    When the run dies (killed, crashed) renewals stop and the Lease lapses after its
    duration: the next run takes it. Returns the renewer's pid in the parent."""
    started = process_start(pid)
    read_end, write_end = os.pipe()
    first = os.fork()
    if first:
        os.close(write_end)
        grandchild = int(os.read(read_end, 32) or 0)
        os.close(read_end)
        os.waitpid(first, 0)
        return grandchild
    try:  # first child: a session of its own, then the renewer, then leave
        os.close(read_end)
        os.setsid()
        second = os.fork()
        if second:
            os.write(write_end, str(second).encode())
            os._exit(0)
        os.close(write_end)
        lock.reader.pool.clear()  # the parent's connections are not ours to use
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.closerange(3, 1024)  # and no pipe of the run's stays open (Ansible waits for them to close)
        while pid_alive(pid, started):
            time.sleep(interval)
            if not pid_alive(pid, started):
                break
            try:
                if not lock.renew():
                    break
            except Exception:  # the API away for a while: keep trying until the run ends
                continue
    finally:
        os._exit(0)


def outermost_ansible(start=None):
    """The pid of the outermost ansible-playbook / ansible process above this one, or None."""
    pid, found = start or os.getppid(), None
    for _depth in range(64):
        if pid <= 1:
            break
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as fh:
                argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
            with open("/proc/%d/stat" % pid) as fh:
                parent = int(fh.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
        names = [os.path.basename(a) for a in argv[:2]]
        if any(n in ("ansible-playbook", "ansible") for n in names):
            found = pid
        pid = parent
    return found


LEASE_ARGUMENT_SPEC = with_auth(dict(
    name=dict(type="str", default="converged-hpc"),
    namespace=dict(type="str", default="default"),
    state=dict(type="str", choices=["acquired", "released"], default="acquired"),
    holder=dict(type="str"),
    duration=dict(type="int", default=60),
    timeout=dict(type="int", default=1800),
    poll=dict(type="float", default=2),
    renew=dict(type="bool", default=True),
))


def lease_task(params, check_mode):
    """The converged.hpc.lease task on validated params: its result, with failed and msg when it failed.

    Run by the module (a process of its own) or by the action plugin in a worker of ansible-playbook:
    either way the outermost ansible-playbook above is the run the Lease is held for."""
    if params["duration"] < 5:
        return dict(failed=True, msg="duration %d is too short: a Lease must live at least 5 s between renewals"
                    % params["duration"])
    run_pid = outermost_ansible()
    holder = params["holder"] or "%s ansible-playbook pid %s" % (socket.gethostname(), run_pid or os.getppid())

    def work(reader):
        lock = LeaseLock(reader, params["namespace"], params["name"], holder, params["duration"])
        if params["state"] == "released":
            changed, found = lock.release(check_mode)
            return dict(changed=changed, holder=holder, previous_holder=found)
        if params["renew"] and not check_mode and run_pid is None:
            return dict(failed=True, msg="renew needs this module to run on the control node, under "
                                         "ansible-playbook (delegate_to: localhost), or set renew: false")
        try:
            result = lock.acquire(params["timeout"], params["poll"], check_mode)
        except LeaseHeld as exc:
            if check_mode:
                return dict(changed=False, holder=holder, previous_holder=exc.holder, msg=str(exc))
            return dict(failed=True, msg=str(exc), holder=holder, previous_holder=exc.holder)
        out = dict(changed=result["changed"], holder=holder, previous_holder=result["previous_holder"],
                   waited=result["waited"], lease=(result["lease"] or {}).get("spec") or {})
        if params["renew"] and not check_mode and result["previous_holder"] != holder:
            out["renewer_pid"] = keep_renewed(lock, run_pid, max(1.0, params["duration"] / 3.0))
        return out

    return api_task(params, "lease %s/%s" % (params["namespace"], params["name"]), work)
