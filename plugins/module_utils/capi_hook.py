# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Our deletion hook on a Cluster API Machine: one annotation, put or released.

API access only; the module (plugins/modules/machine_hook.py), its action plugin (the same work in
the controller's process when the task runs there) and the tests use it. A change is a JSON merge
patch of that one annotation carrying the resourceVersion it was computed from: if the Machine
changed in between (Cluster API's own writes, another run), the API answers 409 and the Machine is
read again. Nothing else on the Machine is ever written.
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

HOOK_ARGUMENT_SPEC = with_auth(dict(
    name=dict(type="str", required=True),
    namespace=dict(type="str", required=True),
    api_version=dict(type="str", default="cluster.x-k8s.io/v1beta1"),
    hook=dict(type="str", required=True),
    owner=dict(type="str", default="converged-hpc"),
    state=dict(type="str", choices=["present", "absent"], default="present"),
))

HOOK_PREFIXES = ("pre-drain.delete.hook.machine.cluster.x-k8s.io/", "pre-terminate.delete.hook.machine.cluster.x-k8s.io/")
ATTEMPTS = 5


def machine_path(api_version, namespace, name):
    return "/apis/%s/namespaces/%s/machines/%s" % (api_version, quote(namespace, safe=""), quote(name, safe=""))


def set_hook(reader, api_version, namespace, name, hook, owner, present, check_mode=False):
    """Put (present) or release the annotation hook on Machine namespace/name.

    Returns (changed, machine): machine is the Machine after the change, or None when it does not
    exist. A Machine that does not exist has no hook to release; putting one on it fails."""
    path = machine_path(api_version, namespace, name)
    what = "Machine %s/%s" % (namespace, name)
    for _attempt in range(ATTEMPTS):
        status, body = reader.request(path)
        if status == 404:
            if present:
                raise CapiApiError("%s does not exist (%s): no hook can hold it" % (what, api_version))
            return False, None
        if status != 200:
            raise CapiApiError("reading %s failed with HTTP %s: %s" % (what, status, _status_message(body)))
        machine = json.loads(body)
        meta = machine.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if (hook in annotations) == present:
            return False, machine
        if check_mode:
            return True, machine
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {hook: owner if present else None}}}
        status, body = reader.request(path, method="PATCH", body=patch, content_type="application/merge-patch+json")
        if status == 200:
            return True, json.loads(body)
        if status == 404 and not present:
            return False, None  # gone between the read and the patch
        if status != 409:
            action = "putting" if present else "releasing"
            raise CapiApiError("%s %s on %s failed with HTTP %s: %s"
                               % (action, hook, what, status, _status_message(body)))
    raise CapiApiError("%s kept changing under us (%d tries): %s not %s"
                       % (what, ATTEMPTS, hook, "put" if present else "released"))


def hook_task(params, check_mode):
    """The converged.hpc.machine_hook task on validated params: its result, with failed and msg when it failed."""
    hook = params["hook"]
    if not hook.startswith(HOOK_PREFIXES) or hook.endswith("/"):
        return dict(failed=True, msg="hook %r is not a Cluster API deletion hook: it must be %s<name>"
                    % (hook, " or ".join(HOOK_PREFIXES)))

    def work(reader):
        changed, machine = set_hook(reader, params["api_version"], params["namespace"], params["name"], hook,
                                    params["owner"], params["state"] == "present", check_mode)
        meta = (machine or {}).get("metadata") or {}
        return dict(changed=changed, exists=machine is not None, hook=hook,
                    annotations=meta.get("annotations") or {},
                    deleting=bool(meta.get("deletionTimestamp")))

    return api_task(params, "machine_hook %s/%s" % (params["namespace"], params["name"]), work)
