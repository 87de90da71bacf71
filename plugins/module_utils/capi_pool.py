# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bare-metal pool as move.yml and rebalance.yml read it: a namespace's MachineDeployments,
Metal3MachineTemplates, BareMetalHosts and Machines, listed at once (one request each, in parallel).

API access only; the module (plugins/modules/pool_info.py), its action plugin (the same work in the
controller's process, without a module's start-up for each read of a move's waits) and the tests use it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import api_task, with_auth

KINDS = ("deployments", "templates", "hosts", "machines", "machinesets")
PLURALS = {"deployments": "machinedeployments", "templates": "metal3machinetemplates", "hosts": "baremetalhosts",
           "machines": "machines", "machinesets": "machinesets"}
# what is listed when kinds is not given (machinesets only when asked: rollout.yml)
DEFAULT_KINDS = ("deployments", "templates", "hosts", "machines")

POOL_INFO_ARGUMENT_SPEC = with_auth(dict(
    namespace=dict(type="str", required=True),
    kinds=dict(type="list", elements="str", choices=list(KINDS), default=list(DEFAULT_KINDS)),
    api_version=dict(type="str", default="cluster.x-k8s.io/v1beta2"),
    metal3_api_version=dict(type="str", default="infrastructure.cluster.x-k8s.io/v1beta2"),
    machine_selector=dict(type="str"),
))


def _group_version(api_version, option):
    group, sep, version = api_version.rpartition("/")
    if not sep or not group or not version:
        raise ValueError("%s %r: expected group/version" % (option, api_version))
    return group, version


def pool_info_task(params, check_mode):
    """The converged.hpc.pool_info task on validated params (read only: check mode reads too)."""
    del check_mode
    try:
        apis = {"deployments": _group_version(params["api_version"], "api_version"),
                "machines": _group_version(params["api_version"], "api_version"),
                "machinesets": _group_version(params["api_version"], "api_version"),
                "templates": _group_version(params["metal3_api_version"], "metal3_api_version"),
                "hosts": ("metal3.io", "v1alpha1")}
    except ValueError as exc:
        return dict(failed=True, msg=str(exc))
    kinds = list(dict.fromkeys(params["kinds"]))

    def work(reader):
        lists = {}
        for kind in kinds:
            group, version = apis[kind]
            options = {"namespace": params["namespace"], "managed_fields": False}
            if kind in ("machines", "machinesets") and params.get("machine_selector"):
                options["label_selector"] = params["machine_selector"]
            lists[kind] = ((group, version, PLURALS[kind]), options)
        found = reader.list_many(lists)
        errors = [str(found[k]) for k in kinds if isinstance(found[k], CapiApiError)]
        if errors:
            return dict(failed=True, msg="; ".join(errors))
        return dict(changed=False, **dict((k, found[k]) for k in kinds))
    return api_task(params, "reading the pool in namespace %s" % params["namespace"], work)
