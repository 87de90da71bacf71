# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The autoscaler's decision: Slurm's pending demand against the MachineDeployments that feed its nodesets."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: autoscale_plan
short_description: Decide each autoscaled MachineDeployment's replicas from Slurm's queue
version_added: 0.4.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Input is what M(converged.hpc.slurm_queue) returned. Each runnable pending job is given to the first pool
    (in namespace/name order) whose node type's partitions hold one of the job's partitions and whose features
    (the node type, and the template's feature labels) satisfy the job's constraint (C(&), C(|), C(,),
    brackets and C(*N) counts understood). A job no pool can run, and a job more nodes would not start (held,
    a dependency...), scales nothing and is named in RV(_value.waiting).
  - Per pool, the demand is the nodes its jobs need (C(max(nodes, ceil(cpus / cpus per node)))). Idle nodes and
    the nodes still joining (replicas that are not yet an idle or busy Slurm node) count against it; what is
    left is added to the replicas, up to the pool's C(max). Below C(min), the pool grows to C(min).
  - With no demand left over, nodes idle for at least O(idle_time) seconds (Slurm's C(LastBusyTime)) are
    removed, never below C(min), never a busy node, and never within O(cooldown) seconds of the pool's last
    scale-up. RV(_value.pools[].victims) are the Machines to mark with C(cluster.x-k8s.io/delete-machine)
    before the replicas are lowered, so that Cluster API deletes exactly those.
  - Every pool gets one line (RV(_value.lines)) - partition, pending demand, idle nodes, current -> desired,
    and why.
positional: pools, hostvars, hosts
options:
  _input:
    description: The registered result of M(converged.hpc.slurm_queue).
    type: dict
    required: true
  pools:
    description: The pools, from P(converged.hpc.autoscale_pools#filter).
    type: list
    elements: dict
    required: true
  hostvars:
    description: C(hostvars), after the contract (each host's C(converged_slurm_node_name) and Machine data).
    type: raw
    required: true
  hosts:
    description: The hosts to read (C(groups['all'])).
    type: list
    elements: str
    required: true
  idle_time:
    description: Seconds a node stays idle before it may be removed.
    type: int
    default: 300
  cooldown:
    description: Seconds after a pool's last scale-up during which it is not scaled down.
    type: int
    default: 120
  capi_var:
    description: The inventory plugin's hostvar_name.
    type: str
    default: capi
"""

EXAMPLES = r"""
plan: "{{ queue | converged.hpc.autoscale_plan(pools, hostvars, groups['all'], idle_time=300, cooldown=120) }}"
"""

RETURN = r"""
_value:
  description:
    - C(pools) - per pool C(namespace), C(name), C(replicas), C(desired), C(action) (C(up), C(down), C(none)),
      C(victims) (C({namespace, name, node}) of each Machine to delete), C(jobs) (the IDs it serves), C(line).
    - C(waiting) - one sentence per pending job that scales nothing, and why.
    - C(lines) - every pool's line, then C(waiting).
    - C(changes) - true when a pool's replicas change.
  type: dict
"""

import math
import re

from ansible.errors import AnsibleFilterError
from ansible_collections.converged.hpc.plugins.filter.contract import FEATURE_LABEL_PREFIX, label_features

MIN_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
MAX_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
SCALED_UP_ANNOTATION = "converged.hpc/scaled-up-at"
_COUNT = re.compile(r"\*\d+$")


def _whole(value, what, errors):
    if isinstance(value, bool):
        errors.append("%s %r is not a whole number" % (what, value))
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        errors.append("%s %r is not a whole number" % (what, value))
        return None
    if number < 0:
        errors.append("%s %r is negative" % (what, value))
        return None
    return number


def autoscale_pools(machine_deployments, node_types, settings=None, slurm_partitions=None,
                    node_type_label="node-type", feature_label_prefix=FEATURE_LABEL_PREFIX):
    """The autoscaled MachineDeployments, each with its node type's nodeset and partitions, and errors."""
    settings = settings or []
    if not isinstance(settings, list):
        raise AnsibleFilterError("converged_autoscale_pools must be a list of {name, min, max}, got %r"
                                 % (settings,))
    node_types = node_types if isinstance(node_types, dict) else {}
    errors, pools = [], []
    by_name = {}
    for md in machine_deployments or []:
        meta = md.get("metadata") or {}
        by_name[(meta.get("namespace"), meta.get("name"))] = md
    wanted = {}
    for entry in settings:
        if not isinstance(entry, dict) or not entry.get("name"):
            errors.append("converged_autoscale_pools: %r has no MachineDeployment name" % (entry,))
            continue
        matches = [key for key in by_name if key[1] == entry["name"]
                   and (not entry.get("namespace") or key[0] == entry["namespace"])]
        if not matches:
            errors.append("converged_autoscale_pools names MachineDeployment %s, which the cluster does not have "
                          "(it has: %s)" % (entry["name"], ", ".join(sorted(k[1] for k in by_name)) or "none"))
        for key in matches:
            wanted[key] = entry
    for key in sorted(by_name):
        md = by_name[key]
        meta = md.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        entry = wanted.get(key)
        annotated = MAX_ANNOTATION in annotations
        if entry is None and not annotated:
            continue
        entry = entry or {}
        what = "MachineDeployment %s/%s" % key
        size_errors = []
        low = _whole(entry.get("min", annotations.get(MIN_ANNOTATION, 0)), what + ": min", size_errors)
        high = entry.get("max", annotations.get(MAX_ANNOTATION))
        if high is None:
            size_errors.append("%s: no max (set max in converged_autoscale_pools or the annotation %s)"
                               % (what, MAX_ANNOTATION))
        else:
            high = _whole(high, what + ": max", size_errors)
        if not size_errors and low > high:
            size_errors.append("%s: min %d > max %d" % (what, low, high))
        errors.extend(size_errors)
        template = (((md.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}
        node_type = template.get(node_type_label)
        spec = node_types.get(node_type) if node_type else None
        if not isinstance(spec, dict) or spec.get("role") != "compute" or not spec.get("nodeset"):
            compute = sorted(n for n, s in node_types.items() if isinstance(s, dict) and s.get("role") == "compute")
            errors.append("%s: its Machines are node type %s, which feeds no Slurm nodeset (the contract's compute "
                          "node types: %s)" % (what, node_type or "(no %s label in its template)" % node_type_label,
                                               ", ".join(compute) or "none"))
            continue
        partitions = list(spec.get("partitions") or [])
        if slurm_partitions is not None:
            missing = [p for p in partitions if p not in slurm_partitions]
            if missing:
                errors.append("%s: partition(s) %s of node type %s do not exist in Slurm (it has: %s); converge the "
                              "controller first" % (what, ", ".join(missing), node_type,
                                                    ", ".join(slurm_partitions) or "none"))
        if size_errors:
            continue
        try:
            scaled_up_at = float(annotations.get(SCALED_UP_ANNOTATION) or 0)
        except (TypeError, ValueError):
            scaled_up_at = 0.0
        if not math.isfinite(scaled_up_at) or scaled_up_at < 0:
            scaled_up_at = 0.0  # our annotation changed by hand ("inf" would hold every scale-down for good)
        pools.append({"namespace": key[0], "name": key[1], "node_type": node_type, "nodeset": spec["nodeset"],
                      "partitions": partitions,
                      "features": list(dict.fromkeys([node_type] + label_features(template, feature_label_prefix))),
                      "replicas": int((md.get("spec") or {}).get("replicas") or 0), "min": low, "max": high,
                      "scaled_up_at": scaled_up_at})
    return {"pools": pools, "errors": errors}


def constraint_met(constraint, features):
    """Whether a node with these features satisfies a job's --constraint (empty is always met)."""
    text = (constraint or "").replace("[", "").replace("]", "").strip()
    if not text:
        return True
    have = set(features)
    for alternative in text.split("|"):
        needed = {_COUNT.sub("", f).strip() for f in re.split(r"[&,]", alternative) if f.strip()}
        if needed <= have:
            return True
    return False


def _gres(item):
    """C(gpu:a100:2) -> (C(gpu:a100), 2); C(gpu) -> (C(gpu), 1)."""
    parts = str(item).split(":")
    if len(parts) > 1 and parts[-1].isdigit():
        return ":".join(parts[:-1]), int(parts[-1])
    return ":".join(parts), 1


def gres_met(wanted, offered):
    """Whether a node offering these GRES (C(gpu:a100:4)) has what a job asks per node (C(gpu:2), C(gpu:a100:2))."""
    have = {}
    for item in offered or []:
        name, count = _gres(item)
        have[name] = have.get(name, 0) + count
        if ":" in name:  # gpu:a100:4 also offers gpu:4
            kind = name.split(":", maxsplit=1)[0]
            have[kind] = have.get(kind, 0) + count
    return all(have.get(name, 0) >= count for name, count in (_gres(item) for item in wanted or []))


def _machines(hostvars, hosts, capi_var):
    """Slurm node name -> the Machine behind it (namespace, name, deployment, deleting, cpus)."""
    out = {}
    for host in hosts or []:
        hv = hostvars[host]
        capi = hv.get(capi_var)
        if not isinstance(capi, dict) or not capi.get("machine_deployment"):
            continue
        node = hv.get("converged_slurm_node_name") or capi.get("hostname") or host.split(".")[0]
        out[str(node)] = {"namespace": capi.get("namespace"), "name": capi.get("name"),
                          "deployment": capi.get("machine_deployment"), "deleting": bool(capi.get("deleting")),
                          "cpus": capi.get("cpus")}
    return out


def _nodes_needed(job, cpus_per_node):
    if cpus_per_node:
        return max(job["nodes"], int(math.ceil(float(job["cpus"]) / cpus_per_node)))
    return job["nodes"]


def _decide(pool, jobs, nodes, machines, now, idle_time, cooldown):
    ours = [n for n in nodes if (machines.get(n["name"]) or {}).get("deployment") == pool["name"]
            and machines[n["name"]]["namespace"] == pool["namespace"] and not machines[n["name"]]["deleting"]]
    busy = [n for n in ours if n["busy"]]
    idle = [n for n in ours if n["available"] and not n["busy"]]
    cpus = max([n.get("cpus") or 0 for n in ours]
               + [m.get("cpus") or 0 for m in machines.values() if m["deployment"] == pool["name"]] or [0])
    demand = sum(_nodes_needed(job, cpus) for job in jobs)
    replicas = pool["replicas"]
    joining = max(0, replicas - len(busy) - len(idle))
    shortfall = demand - len(idle) - joining
    desired, victims, why = replicas, [], []
    if shortfall > 0:
        desired = min(pool["max"], replicas + shortfall)
        why.append("%d node(s) short" % shortfall)
        if desired < replicas + shortfall:
            why.append("max %d reached: %d job(s) wait" % (pool["max"], len(jobs)))
    if desired < pool["min"]:
        desired = pool["min"]
        why.append("below min %d" % pool["min"])
    if shortfall <= 0 and desired == replicas:
        surplus = min(len(idle) + joining - demand, replicas - pool["min"])
        ripe = sorted((n for n in idle if n["idle_seconds"] is not None and n["idle_seconds"] >= idle_time),
                      key=lambda n: (-n["idle_seconds"], n["name"]))
        waiting = [n for n in idle if n not in ripe]
        since_up = now - pool["scaled_up_at"] if pool["scaled_up_at"] else None
        if surplus > 0 and ripe and since_up is not None and since_up < cooldown:
            why.append("cooldown: scaled up %d s ago (%d s)" % (since_up, cooldown))
        elif surplus > 0 and ripe:
            for node in ripe[:surplus]:
                machine = machines[node["name"]]
                victims.append({"namespace": machine["namespace"], "name": machine["name"], "node": node["name"]})
            desired = replicas - len(victims)
            why.append("idle >= %d s: %s" % (idle_time, ", ".join(v["node"] for v in victims)))
        if waiting and surplus > len(victims):
            timers = ["%s %s/%d s" % (n["name"], "?" if n["idle_seconds"] is None else n["idle_seconds"], idle_time)
                      for n in waiting]
            why.append("idle timer: %s" % ", ".join(timers))
        if replicas <= pool["min"] and idle:
            why.append("min %d kept" % pool["min"])
    action = "up" if desired > replicas else "down" if desired < replicas else "none"
    line = ("autoscale %s/%s (partition %s): pending %d job(s) needing %d node(s)%s, idle %d, busy %d, joining %d, "
            "replicas %d -> %d (%s)" % (pool["namespace"], pool["name"], ",".join(pool["partitions"]), len(jobs),
                                        demand, " [jobs %s]" % ",".join(j["id"] for j in jobs) if jobs else "",
                                        len(idle), len(busy), joining, replicas, desired,
                                        "; ".join(why) or "steady"))
    return dict(pool, desired=desired, action=action, victims=victims, jobs=[j["id"] for j in jobs],
                demand=demand, idle=[n["name"] for n in idle], busy=len(busy), joining=joining, line=line)


def autoscale_plan(queue, pools, hostvars, hosts, idle_time=300, cooldown=120, capi_var="capi"):
    """See DOCUMENTATION."""
    if not isinstance(queue, dict) or "jobs" not in queue or "nodes" not in queue:
        raise AnsibleFilterError("autoscale_plan: the input must be the registered result of "
                                 "converged.hpc.slurm_queue, got %r" % (type(queue).__name__,))
    machines = _machines(hostvars, hosts, capi_var)
    pools = sorted(pools or [], key=lambda p: (p["namespace"], p["name"]))
    served = {(p["namespace"], p["name"]): [] for p in pools}
    waiting = []
    for job in queue["jobs"]:
        if not job.get("runnable"):
            waiting.append("job %s: pending for %s - more nodes would not start it" % (job["id"], job["reason"]))
            continue
        for pool in pools:
            if set(job["partitions"]) & set(pool["partitions"]) and constraint_met(job["features"], pool["features"]) \
                    and gres_met(job.get("gres"), pool.get("gres")):
                served[(pool["namespace"], pool["name"])].append(job)
                break
        else:
            waiting.append("job %s: no autoscaled MachineDeployment can run it (partition %s%s%s)"
                           % (job["id"], ",".join(job["partitions"]),
                              ", constraint %s" % job["features"] if job["features"] else "",
                              ", gres %s" % ",".join(job["gres"]) if job.get("gres") else ""))
    now = float(queue.get("now") or 0)
    decided = [_decide(p, served[(p["namespace"], p["name"])], queue["nodes"], machines, now, int(idle_time),
                       int(cooldown)) for p in pools]
    return {"pools": decided, "waiting": waiting, "lines": [p["line"] for p in decided] + waiting,
            "changes": any(p["action"] != "none" for p in decided)}


class FilterModule(object):
    def filters(self):
        return {"autoscale_plan": autoscale_plan, "autoscale_pools": autoscale_pools}
