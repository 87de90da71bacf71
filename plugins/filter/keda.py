# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""KEDA on Slurm's demand: the GJSON path its metrics-api scaler reads a partition's demand with from
slurmrestd, and the TriggerAuthentication and ScaledObjects playbooks/keda.yml writes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: keda_demand
short_description: The valueLocation of a KEDA metrics-api trigger reading a partition's demand from slurmrestd
version_added: 0.10.0
author: converged.hpc contributors (@converged-hpc)
description:
  - KEDA's C(metrics-api) scaler GETs a URL and reads one number from the JSON answer at C(valueLocation), a
    GJSON path. Given slurmrestd's C(GET /slurm/<version>/jobs), this filter makes the path that counts the
    nodes a partition's jobs ask for - what a compute MachineDeployment must hold, so that KEDA's
    HorizontalPodAutoscaler (target C(AverageValue) 1 a replica) sets its replicas to that number.
  - Counted - the running jobs of the partition (C(RUNNING), C(CONFIGURING)), and its pending jobs that more
    nodes would start, the rule of C(converged.hpc.slurm_queue) - pending for C(Resources), C(Priority),
    C(PartitionConfig), C(PartitionNodeLimit), C(NodeDown), C(ReqNodeNotAvail) or C(None), with no
    dependency left. Held jobs, dependent jobs, begin times, reservations, limits and other partitions
    never count.
  - Each job counts its node count (C(node_count.number)), up to O(max_nodes) - GJSON cannot add numbers,
    so the path repeats each clause for 1 to O(max_nodes) nodes and counts the matches.
  - What it cannot see (docs/autoscale.md) - a pending job array is one record (its tasks count once);
    jobs sharing a node count one node each; a job listing several partitions matches only when its
    partition is exactly O(partition); features, GRES and memory are not checked.
positional: max_nodes
options:
  _input:
    description: The Slurm partition.
    type: str
    required: true
  max_nodes:
    description: The most nodes one job counts for (the MachineDeployment's maximum is enough).
    type: int
    required: true
"""

EXAMPLES = r"""
- name: The trigger's valueLocation for partition compute, at most 10 nodes
  ansible.builtin.debug:
    msg: "{{ 'compute' | converged.hpc.keda_demand(10) }}"
"""

RETURN = r"""
_value:
  description: The GJSON path; its value is the number of nodes demanded.
  type: str
"""

import re

from ansible.errors import AnsibleFilterError

# job states that hold nodes, and why a pending job waits when more nodes would start it (slurm_queue's rule)
HOLDING = ("RUNNING", "CONFIGURING")
RUNNABLE = ("Resources", "Priority", "PartitionConfig", "PartitionNodeLimit", "NodeDown", "ReqNodeNotAvail", "None")
PARTITION = re.compile(r"^[A-Za-z0-9_.-]+$")
# the path grows by about 1 kB a node (9 clauses for each node count): beyond this, autoscale.yml
MAX_NODES = 200


def keda_demand(partition, max_nodes):
    if not isinstance(partition, str) or not PARTITION.match(partition):
        raise AnsibleFilterError("keda_demand: partition %r is not a Slurm partition name" % (partition,))
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or not 1 <= max_nodes <= MAX_NODES:
        raise AnsibleFilterError("keda_demand: max_nodes %r is not a whole number from 1 to %d" % (max_nodes, MAX_NODES))
    base = 'jobs.#(partition=="%s")#' % partition
    clauses = ['%s|#(job_state.0=="%s")#' % (base, state) for state in HOLDING]
    clauses += ['%s|#(job_state.0=="PENDING")#|#(state_reason=="%s")#|#(dependency=="")#' % (base, reason)
                for reason in RUNNABLE]
    counted = ["%s|#(node_count.number>=%d)#" % (clause, n) for n in range(1, max_nodes + 1) for clause in clauses]
    return "[%s]|@flatten|#" % ",".join(counted)


NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# a pool's settings: (default, lowest); None: required
POOL_SETTINGS = {"deployment": None, "partition": None, "max": (None, 1), "min": (0, 0), "polling": (30, 1),
                 "cooldown": (300, 0)}


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def keda_objects(pools, namespace, url, auth="slurmrestd", secret="slurm-keda-token"):
    """{errors, objects}: for each pool ({deployment, partition, max, min, polling, cooldown}), a ScaledObject on
    the MachineDeployment deployment whose metrics-api trigger reads the demand of partition from url
    (slurmrestd's jobs), with the TriggerAuthentication auth (the token in Secret secret, key token) before
    them; no object when any setting is wrong, errors naming each bad value."""
    errors, objects, seen = [], [], set()
    if not isinstance(namespace, str) or not NAME.match(namespace):
        errors.append("namespace %r is not a Kubernetes namespace name" % (namespace,))
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+/slurm/v[0-9.]+/jobs$", url):
        errors.append("url %r is not slurmrestd's jobs URL (http://host:port/slurm/vX.Y.Z/jobs)" % (url,))
    if not isinstance(pools, list) or not pools:
        errors.append("converged_keda_pools %r: give a list of pools, each {deployment, partition, max}" % (pools,))
        pools = []
    for index, pool in enumerate(pools):
        where = "converged_keda_pools[%d]" % index
        if not isinstance(pool, dict):
            errors.append("%s %r is not a mapping" % (where, pool))
            continue
        unknown = sorted(set(pool) - set(POOL_SETTINGS))
        if unknown:
            errors.append("%s: unknown setting(s) %s (known: %s)" % (where, ", ".join(unknown),
                                                                     ", ".join(sorted(POOL_SETTINGS))))
        got = {}
        for key, rule in POOL_SETTINGS.items():
            value = pool.get(key, rule[0] if rule else None)
            if rule is None:
                pattern = NAME if key == "deployment" else PARTITION
                if not isinstance(value, str) or not pattern.match(value):
                    errors.append("%s.%s %r is not a %s name" % (where, key, value, "MachineDeployment"
                                                                 if key == "deployment" else "Slurm partition"))
            elif not _whole(value) or not rule[1] <= value <= (MAX_NODES if key in ("min", "max") else 86400):
                errors.append("%s.%s %r is not a whole number from %d to %d"
                              % (where, key, value, rule[1], MAX_NODES if key in ("min", "max") else 86400))
            got[key] = value
        if _whole(got["min"]) and _whole(got["max"]) and got["min"] > got["max"]:
            errors.append("%s: min %d is above max %d" % (where, got["min"], got["max"]))
        if got["deployment"] in seen:
            errors.append("%s: MachineDeployment %r is given twice" % (where, got["deployment"]))
        seen.add(got["deployment"])
        if not errors:
            objects.append(_scaled_object(got, namespace, url, auth))
    if errors:
        return {"errors": errors, "objects": []}
    auth_obj = {"apiVersion": "keda.sh/v1alpha1", "kind": "TriggerAuthentication",
                "metadata": {"name": auth, "namespace": namespace,
                             "labels": {"app.kubernetes.io/managed-by": "converged.hpc"}},
                "spec": {"secretTargetRef": [{"parameter": "apiKey", "name": secret, "key": "token"}]}}
    return {"errors": [], "objects": [auth_obj] + objects}


def _scaled_object(pool, namespace, url, auth):
    return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": pool["deployment"], "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "converged.hpc"}},
            "spec": {"scaleTargetRef": {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                                        "name": pool["deployment"]},
                     "pollingInterval": pool["polling"], "cooldownPeriod": pool["cooldown"],
                     "minReplicaCount": pool["min"], "maxReplicaCount": pool["max"],
                     # the HPA's own scale-down waits as long as KEDA's cooldown (its default: 300 s)
                     "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                         "scaleDown": {"stabilizationWindowSeconds": pool["cooldown"]}}}},
                     "triggers": [{"type": "metrics-api", "metricType": "AverageValue",
                                   "authenticationRef": {"name": auth},
                                   "metadata": {"url": url, "format": "json", "authMode": "apiKey",
                                                "method": "header", "keyParamName": "X-SLURM-USER-TOKEN",
                                                "targetValue": "1",
                                                "valueLocation": keda_demand(pool["partition"], pool["max"])}}]}}


class FilterModule(object):
    def filters(self):
        return {"keda_demand": keda_demand, "keda_objects": keda_objects}
