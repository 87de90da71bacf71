# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where the pool's idle hosts should be: Slurm's pending jobs against a Kubernetes workload cluster's
pending Pods, for each pair of MachineDeployments that share hosts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: rebalance_plan
short_description: Decide which idle hosts move between Slurm and a Kubernetes workload cluster
version_added: 0.6.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Each pair (O(pairs)) names a Slurm MachineDeployment and a Kubernetes workers' one that take hosts from
    one pool, the Slurm partition its nodes serve and the resource the workers' Pods ask for (C(nvidia.com/gpu),
    C(cpu)).
  - Slurm waits when runnable jobs are pending in the partition (the nodes they need); Kubernetes waits when
    Pods no node took are Pending and ask for the resource (the hosts they need, from a host's capacity).
  - Hosts move from the side with nothing waiting to the side that waits, and when both wait, from the side
    without C(priority) to the one with it. Only idle hosts move (a Slurm node with no job, a Node with no Pod
    but DaemonSet ones), never below a side's minimum, and not within C(cooldown) seconds of the pair's last
    move (annotation C(converged.hpc/rebalanced-at) on its Slurm MachineDeployment).
  - One move per run, the first pair's that has one; every pair gets one line (RV(_value.lines)).
  - RV(_value.errors) names every bad pair before anything is decided.
positional: queue, pods, nodes, deployments, hosts, machines
options:
  _input:
    description: The pairs, each C({slurm, kubernetes, partition, resource}) and optionally C(priority)
      (C(slurm) or C(kubernetes), default C(slurm)), C(min_slurm), C(min_kubernetes) (default 0), C(cooldown)
      (default 300 s) and C(namespace).
    type: list
    elements: dict
    required: true
  queue:
    description: The registered result of M(converged.hpc.slurm_queue).
    type: dict
    required: true
  pods:
    description: The workload cluster's Pods.
    type: list
    elements: dict
    required: true
  nodes:
    description: The workload cluster's Nodes.
    type: list
    elements: dict
    required: true
  deployments:
    description: The management cluster's MachineDeployments.
    type: list
    elements: dict
    required: true
  hosts:
    description: The BareMetalHosts.
    type: list
    elements: dict
    required: true
  machines:
    description: The Machines.
    type: list
    elements: dict
    required: true
  now:
    description: The time (epoch seconds) to measure the cooldown from.
    type: float
    required: true
"""

EXAMPLES = r"""
plan: "{{ pairs | converged.hpc.rebalance_plan(queue, pods, nodes, mds, bmhs, machines, now=queue.now) }}"
"""

RETURN = r"""
_value:
  description:
    - C(errors) - the bad pairs (nothing is decided when there is one).
    - C(move) - the move to make (C({from, to, hosts, namespace}), for P(converged.hpc.move_plan#filter)), or C({}).
    - C(pair) - the Slurm MachineDeployment of the pair that moves (for its cooldown annotation).
    - C(lines) - one line per pair.
  type: dict
"""

import math

from ansible.errors import AnsibleFilterError

REBALANCED_AT = "converged.hpc/rebalanced-at"
DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"


def _quantity(value):
    """A Kubernetes quantity as a number (cpu 500m -> 0.5, 2 -> 2); 0 when unreadable."""
    text = str(value).strip()
    try:
        if text.endswith("m"):
            return float(text[:-1]) / 1000
        return float(text)
    except ValueError:
        return 0


def _asks(pod, resource):
    total = 0
    for container in ((pod.get("spec") or {}).get("containers") or []):
        res = container.get("resources") or {}
        asked = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource, 0))
        total += _quantity(asked)
    return total


def _live(obj):
    return not obj["metadata"].get("deletionTimestamp")


def _check(pair, index, deployments, partitions):
    errors = []
    where = "rebalance pair %d (%s)" % (index + 1, pair)
    if not isinstance(pair, dict):
        return ["%s: must be a dict {slurm, kubernetes, partition, resource}" % where]
    namespace = pair.get("namespace") or "metal3"
    for side in ("slurm", "kubernetes"):
        name = pair.get(side)
        if not name or not any(d["metadata"]["name"] == name and d["metadata"].get("namespace") == namespace
                               for d in deployments):
            errors.append("%s: %s MachineDeployment %s/%s does not exist" % (where, side, namespace, name))
    if pair.get("partition") not in partitions:
        errors.append("%s: Slurm has no partition %r (it has %s)"
                      % (where, pair.get("partition"), ", ".join(partitions) or "none"))
    if not pair.get("resource") or not isinstance(pair.get("resource"), str):
        errors.append("%s: resource must name what the Pods ask for (nvidia.com/gpu, cpu), got %r"
                      % (where, pair.get("resource")))
    if pair.get("priority", "slurm") not in ("slurm", "kubernetes"):
        errors.append("%s: priority must be slurm or kubernetes, got %r" % (where, pair.get("priority")))
    for key, default in (("min_slurm", 0), ("min_kubernetes", 0), ("cooldown", 300)):
        value = pair.get(key, default)
        if isinstance(value, bool) or not str(value).isdigit():
            errors.append("%s: %s must be a whole number >= 0, got %r" % (where, key, value))
    return errors


def _members(machines, namespace, md):
    return sorted((m for m in machines if m["metadata"].get("namespace") == namespace and _live(m)
                   and (m["metadata"].get("labels") or {}).get(DEPLOYMENT_LABEL) == md),
                  key=lambda m: m["metadata"]["name"])


def _host_of(machine, hosts):
    infra = ((machine.get("spec") or {}).get("infrastructureRef") or {}).get("name", machine["metadata"]["name"])
    return next((h for h in hosts if h["metadata"].get("namespace") == machine["metadata"].get("namespace")
                 and ((h.get("spec") or {}).get("consumerRef") or {}).get("name") == infra), None)


def _hostname(machine):
    return next((a["address"] for a in (machine.get("status") or {}).get("addresses") or []
                 if a.get("type") == "Hostname"), None)


def _capacity(host, resource):
    """What one host offers of the resource: GPUs from GPU feature discovery's count label, CPUs from the
    inspected hardware; 1 when unknown."""
    labels = (host or {}).get("metadata", {}).get("labels") or {}
    if resource == "nvidia.com/gpu":
        return max(1, int(_quantity(labels.get("nvidia.com/gpu.count", 1))))
    if resource == "cpu":
        return max(1, int(((((host or {}).get("status") or {}).get("hardware") or {}).get("cpu") or {})
                          .get("count") or 1))
    return 1


def rebalance_plan(pairs, queue, pods, nodes, deployments, hosts, machines, now):
    """See DOCUMENTATION."""
    if not isinstance(pairs, list):
        raise AnsibleFilterError("rebalance_plan: the pairs must be a list, got %r" % (pairs,))
    partitions = list(queue.get("partitions") or [])
    errors = []
    for index, pair in enumerate(pairs):
        errors.extend(_check(pair, index, deployments, partitions))
    out = {"errors": errors, "move": {}, "pair": {}, "lines": []}
    if errors:
        return out
    slurm_nodes = dict((n["name"], n) for n in queue.get("nodes") or [])
    node_names = set(n["metadata"]["name"] for n in nodes)
    # a Node is busy while a Pod other than a DaemonSet's runs (or is about to) on it
    busy_nodes = set()
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        owners = pod["metadata"].get("ownerReferences") or []
        if spec.get("nodeName") and status.get("phase") not in ("Succeeded", "Failed") \
                and not any(o.get("kind") == "DaemonSet" for o in owners):
            busy_nodes.add(spec["nodeName"])
    for pair in pairs:
        namespace = pair.get("namespace") or "metal3"
        mds = dict((d["metadata"]["name"], d) for d in deployments if d["metadata"].get("namespace") == namespace)
        slurm_md = mds[pair["slurm"]]
        priority = pair.get("priority", "slurm")
        mins = {"slurm": int(pair.get("min_slurm", 0)), "kubernetes": int(pair.get("min_kubernetes", 0))}
        # Slurm waits: runnable jobs of the partition, the nodes they need
        jobs = [j for j in queue.get("jobs") or [] if pair["partition"] in (j.get("partitions") or [])
                and j.get("runnable")]
        slurm_need = sum(max(1, int(j.get("nodes") or 1)) for j in jobs)
        # Kubernetes waits: Pending Pods no node took that ask for the resource
        waiting_pods = [p for p in pods if (p.get("status") or {}).get("phase") == "Pending"
                        and not (p.get("spec") or {}).get("nodeName") and _live(p) and _asks(p, pair["resource"]) > 0]
        slurm_members, kube_members = _members(machines, namespace, pair["slurm"]), \
            _members(machines, namespace, pair["kubernetes"])
        any_host = next((h for h in (_host_of(m, hosts) for m in kube_members + slurm_members) if h), None)
        per_host = _capacity(any_host, pair["resource"])
        kube_need = int(math.ceil(sum(_asks(p, pair["resource"]) for p in waiting_pods) / float(per_host))) \
            if waiting_pods else 0
        # idle hosts of each side: only these ever move
        idle = {"slurm": [], "kubernetes": []}
        for machine in slurm_members:
            node = slurm_nodes.get(_hostname(machine) or "")
            if node is not None and not node.get("busy") and node.get("available", True) \
                    and str(node.get("state", "")).upper().startswith("IDLE"):
                idle["slurm"].append(machine)
        for machine in kube_members:
            node = ((machine.get("status") or {}).get("nodeRef") or {}).get("name")
            if node and node in node_names and node not in busy_nodes:
                idle["kubernetes"].append(machine)
        count = {"slurm": len(slurm_members), "kubernetes": len(kube_members)}
        need = {"slurm": slurm_need, "kubernetes": kube_need}
        if slurm_need and kube_need:
            to = priority
        elif slurm_need:
            to = "slurm"
        elif kube_need:
            to = "kubernetes"
        else:
            to = None
        head = "rebalance %s <-> %s: Slurm partition %s needs %d node(s) (%d job(s)), %d idle of %d; Kubernetes " \
               "needs %d host(s) for %d Pod(s) asking %s, %d idle of %d" % (
                   pair["slurm"], pair["kubernetes"], pair["partition"], slurm_need, len(jobs),
                   len(idle["slurm"]), count["slurm"], kube_need, len(waiting_pods), pair["resource"],
                   len(idle["kubernetes"]), count["kubernetes"])
        if to is None:
            out["lines"].append(head + ": nothing waits, nothing moves")
            continue
        frm = "kubernetes" if to == "slurm" else "slurm"
        # what the target still lacks once its own idle hosts take their share
        lacking = max(0, need[to] - len(idle[to]))
        spare = max(0, min(len(idle[frm]), count[frm] - mins[frm]))
        moving = min(lacking, spare)
        if lacking == 0:
            out["lines"].append(head + ": %s's own idle hosts are enough, nothing moves" % to)
            continue
        if need[frm] and to == priority and moving:
            why = "both wait, %s has priority" % to
        elif need[frm]:
            out["lines"].append(head + ": both wait and %s has priority, nothing moves to %s" % (priority, to))
            continue
        else:
            why = "%s waits, %s has nothing waiting" % (to, frm)
        if moving == 0:
            out["lines"].append(head + ": %s waits but %s has no idle host above its minimum %d" % (
                to, frm, mins[frm]))
            continue
        last = (slurm_md["metadata"].get("annotations") or {}).get(REBALANCED_AT)
        try:
            since = float(now) - float(last) if last is not None else None
        except ValueError:
            since = None
        cooldown = int(pair.get("cooldown", 300))
        if since is not None and since < cooldown:
            out["lines"].append(head + ": %s, but the pair moved %d s ago (cooldown %d s), nothing moves" % (
                why, since, cooldown))
            continue
        if out["move"]:
            out["lines"].append(head + ": %s, %d host(s) to move in a later run (one move per run)" % (why, moving))
            continue
        chosen = [_host_of(m, hosts) for m in idle[frm][:moving]]
        chosen = [h["metadata"]["name"] for h in chosen if h]
        source = pair["kubernetes"] if frm == "kubernetes" else pair["slurm"]
        target = pair["slurm"] if to == "slurm" else pair["kubernetes"]
        out["move"] = {"from": source, "to": target, "hosts": chosen, "namespace": namespace}
        out["pair"] = {"namespace": namespace, "name": slurm_md["metadata"]["name"]}
        out["lines"].append(head + ": %s, moving %s from %s to %s" % (why, ", ".join(chosen), source, target))
    return out


class FilterModule(object):
    def filters(self):
        return {"rebalance_plan": rebalance_plan}
