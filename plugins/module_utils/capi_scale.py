# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A MachineDeployment's replicas changed as one decision: the Machines to go marked first, the
replicas changed through /scale with a JSON patch that tests the replicas the decision was made
from, and both undone when the change does not happen.

API access only; the module (plugins/modules/capi_scale.py), its action plugin (the same work in the
controller's process) and the tests use it. A real kube-apiserver takes only a merge patch or a JSON
patch on a custom resource's /scale (a strategic merge patch is 415): the JSON patch's "test" makes a
concurrent change of the replicas a refusal (422) instead of a lost update. At 0 replicas a real
server's Scale has no spec.replicas (autoscaling/v1's omitempty) and a test of 0 is refused: from 0 the
Scale is read again after step 1 and the write tests that resourceVersion instead.

The order keeps every state a failure can leave one the next run reads correctly:

1. annotations on the MachineDeployment (the autoscaler's scale-up time), written first;
2. cluster.x-k8s.io/delete-machine on each Machine to go (Cluster API deletes marked Machines first);
3. the replicas, tested and replaced.

When 2 or 3 fails, what 1 and 2 wrote is put back as it was, and the task fails naming what
happened. If putting it back fails too (the API gone mid-way), a mark of ours is left on a Machine
that no scale-down removes: every run first takes back such stale marks (ours, on a Machine not being
deleted, while the MachineDeployment has no more Machines than replicas, so no deletion is pending),
so a later scale-down, ours or anyone's, never picks a Machine for a decision that was not made.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

try:
    from urllib.parse import quote
except ImportError:  # pragma: no cover - Python 2
    from urllib import quote

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError, _status_message
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import api_task, with_auth

DELETE_MACHINE = "cluster.x-k8s.io/delete-machine"
OWNER_LABELS = {"MachineDeployment": "cluster.x-k8s.io/deployment-name", "MachineSet": "cluster.x-k8s.io/set-name"}
PLURALS = {"MachineDeployment": "machinedeployments", "MachineSet": "machinesets"}

SCALE_ARGUMENT_SPEC = with_auth(dict(
    name=dict(type="str", required=True),
    namespace=dict(type="str", required=True),
    kind=dict(type="str", choices=["MachineDeployment", "MachineSet"], default="MachineDeployment"),
    api_version=dict(type="str", default="cluster.x-k8s.io/v1beta2"),
    replicas=dict(type="int", required=True),
    current_replicas=dict(type="int"),
    delete_machines=dict(type="list", elements="str", default=[]),
    delete_reason=dict(type="str", default="converged.hpc"),
    annotations=dict(type="dict", default={}),
))


def _escape(key):
    """A JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


class _Scaler:
    def __init__(self, reader, params, check_mode):
        self.reader, self.p, self.check = reader, params, check_mode
        self.ns = params["namespace"]
        base = "/apis/%s/namespaces/%s" % (params["api_version"], quote(self.ns, safe=""))
        self.owner_path = "%s/%s/%s" % (base, PLURALS[params["kind"]], quote(params["name"], safe=""))
        self.machines_path = base + "/machines"
        self.what = "%s %s/%s" % (params["kind"], self.ns, params["name"])

    def call(self, path, method="GET", body=None, content_type="application/json", query=None, write=False):
        if write and self.check:
            query = dict(query or {}, dryRun="All")  # the server checks the write and keeps nothing
        status, data = self.reader.request(path, query=query, method=method, body=body, content_type=content_type)
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, data

    def fail(self, doing, status, body):
        return CapiApiError("%s: %s failed with HTTP %s: %s" % (self.what, doing, status, _status_message(
            json.dumps(body) if isinstance(body, (dict, list)) else body)))

    # ---- reads
    def scale(self):
        status, body = self.call(self.owner_path + "/scale")
        if status == 404:
            raise CapiApiError("%s does not exist (%s)" % (self.what, self.p["api_version"]))
        if status != 200:
            raise self.fail("reading its scale", status, body)
        # a Scale's spec.replicas is omitted when 0 (autoscaling/v1, omitempty): the resourceVersion then
        # stands in for it in the write's test
        self.version = (body.get("metadata") or {}).get("resourceVersion")
        return (body.get("spec") or {}).get("replicas", 0)

    def machines(self):
        label = "%s=%s" % (OWNER_LABELS[self.p["kind"]], self.p["name"])
        status, body = self.call(self.machines_path, query={"labelSelector": label})
        if status != 200:
            raise self.fail("listing its Machines", status, body)
        return body.get("items") or []

    # ---- writes, each one request
    def mark(self, name, value):
        """Put (value) or take back (None: only when the mark is ours) delete-machine on Machine name."""
        path = "%s/%s" % (self.machines_path, quote(name, safe=""))
        if value is not None:
            return self.call(path, "PATCH", {"metadata": {"annotations": {DELETE_MACHINE: value}}},
                             "application/merge-patch+json", write=True)
        pointer = "/metadata/annotations/" + _escape(DELETE_MACHINE)
        return self.call(path, "PATCH", [{"op": "test", "path": pointer, "value": self.p["delete_reason"]},
                                         {"op": "remove", "path": pointer}],
                         "application/json-patch+json", write=True)

    def annotate(self, values):
        return self.call(self.owner_path, "PATCH", {"metadata": {"annotations": values}},
                         "application/merge-patch+json", write=True)

    def set_replicas(self, current, desired):
        if current:
            ops = [{"op": "test", "path": "/spec/replicas", "value": current},
                   {"op": "replace", "path": "/spec/replicas", "value": desired}]
        else:
            # A real server's Scale omits spec.replicas at 0 (autoscaling/v1, omitempty): no value to test.
            # Read it again (this decision's own annotation has changed the object since) and test its
            # resourceVersion: still 0 now, and no change between that read and this write.
            if self.scale() != 0:
                return 422, {"reason": "Invalid"}  # the replicas changed since the decision: its refusal
            ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": self.version},
                   {"op": "add", "path": "/spec/replicas", "value": desired}]
        return self.call(self.owner_path + "/scale", "PATCH", ops, "application/json-patch+json", write=True)


def _ours(machine, reason):
    return ((machine.get("metadata") or {}).get("annotations") or {}).get(DELETE_MACHINE) == reason


def _deleting(machine):
    return bool((machine.get("metadata") or {}).get("deletionTimestamp"))


def scale_task(params, check_mode):
    """The converged.hpc.capi_scale task on validated params: its result, with failed and msg when it failed."""
    desired, victims = params["replicas"], list(params["delete_machines"])
    if desired < 0:
        return dict(failed=True, msg="replicas %d: must be 0 or more" % desired)
    if len(set(victims)) != len(victims):
        return dict(failed=True, msg="delete_machines names a Machine twice: %s" % ", ".join(victims))
    bad = [k for k in params["annotations"] if not isinstance(params["annotations"][k], str)]
    if bad:
        return dict(failed=True, msg="annotations: the value of %s is not a string" % ", ".join(sorted(bad)))

    def work(reader):
        s = _Scaler(reader, params, check_mode)
        current = s.scale()
        result = dict(changed=False, replicas=current, desired=desired, marked=[], unmarked=[], conflict=False)
        if params["current_replicas"] is not None and params["current_replicas"] != current:
            why = ("%s has %d replicas, not the %d this decision was made from: nothing changed (the next run "
                   "decides again)" % (s.what, current, params["current_replicas"]))
            result.update(conflict=True, desired=current, msg=why, warnings=[why])
            return result
        if victims and desired >= current:
            return dict(failed=True, msg="%s: delete_machines (%s) only with a scale-down, and %d -> %d is not one"
                        % (s.what, ", ".join(victims), current, desired))
        if victims and len(victims) > current - desired:
            return dict(failed=True, msg="%s: %d Machines to delete (%s) for %d -> %d: at most %d"
                        % (s.what, len(victims), ", ".join(victims), current, desired, current - desired))
        machines = {m["metadata"]["name"]: m for m in s.machines()}
        for name in victims:
            if name not in machines:
                return dict(failed=True, msg="%s: Machine %s/%s is not one of its Machines" % (s.what, s.ns, name))
            if _deleting(machines[name]):
                return dict(failed=True, msg="%s: Machine %s/%s is already being deleted" % (s.what, s.ns, name))
        # marks of ours that no deletion is waiting on (see the module's notes): taken back first
        alive = [m for m in machines.values() if not _deleting(m)]
        if len(alive) <= current:
            for m in alive:
                name = m["metadata"]["name"]
                if name not in victims and _ours(m, params["delete_reason"]):
                    status, body = s.mark(name, None)
                    if status not in (200, 404, 422):  # 422: no longer ours (test failed), 404: gone
                        raise s.fail("taking back its stale mark on Machine %s" % name, status, body)
                    if status == 200:
                        result["unmarked"].append(name)
        result["changed"] = bool(result["unmarked"])
        if desired == current:
            return result
        _apply(s, result, current, desired, victims, machines, params)
        return result

    return api_task(params, "capi_scale %s/%s" % (params["namespace"], params["name"]), work)


def _apply(s, result, current, desired, victims, machines, params):
    """Annotations, marks, replicas; on a failure, what was written is put back and CapiApiError raised."""
    owner = None
    undo_annotations = None
    if params["annotations"]:
        status, owner = s.call(s.owner_path)
        if status != 200:
            raise s.fail("reading it", status, owner)
        before = (owner.get("metadata") or {}).get("annotations") or {}
        undo_annotations = {k: before.get(k) for k in params["annotations"]}
        status, body = s.annotate(dict(params["annotations"]))
        if status != 200:
            raise s.fail("writing its annotations", status, body)
    marked = []
    try:
        for name in victims:
            if _ours(machines[name], params["delete_reason"]):
                continue  # marked by an earlier run for this same decision: kept
            status, body = s.mark(name, params["delete_reason"])
            if status != 200:
                raise s.fail("marking Machine %s to be deleted first" % name, status, body)
            marked.append(name)
        status, body = s.set_replicas(current, desired)
        if status == 422 and (body or {}).get("reason") == "Invalid" and not (body or {}).get("details"):
            raise CapiApiError("%s: its replicas changed from %d while this decision was made (the JSON patch's "
                               "test failed): nothing scaled, the next run decides again" % (s.what, current))
        if status != 200:
            raise s.fail("changing its replicas %d -> %d" % (current, desired), status, body)
    except CapiApiError as exc:
        raise CapiApiError("%s; %s" % (exc, _undo(s, marked, undo_annotations)))
    result.update(changed=True, marked=list(victims), replicas=current, desired=desired)


def _undo(s, marked, annotations):
    """Put back what a failed decision wrote; one sentence on how that went."""
    if s.check:
        return "nothing was written (check mode)"
    left = []
    for name in marked:
        try:
            status, _body = s.mark(name, None)
        except CapiApiError:
            status = None
        if status not in (200, 404):
            left.append("the mark on Machine %s" % name)
    if annotations is not None:
        try:
            status, _body = s.annotate(annotations)
        except CapiApiError:
            status = None
        if status != 200:
            left.append("the annotations %s (they stay as written)" % ", ".join(sorted(annotations)))
    if left:
        return ("could not take back %s: the next run takes back a stale mark before it decides"
                % " and ".join(left))
    if marked or annotations is not None:
        return "what it had written was taken back"
    return "nothing was written"
