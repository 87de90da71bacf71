# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What reconcile.yml has to do: Cluster API's view (the inventory, sorted by the contract) against Slurm's."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: reconcile_plan
short_description: Compare the Cluster API inventory with the nodes Slurm knows
version_added: 0.2.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Input is the output lines of C(scontrol show node --oneliner), one record a node. Returns what differs, each
    as a list
  - C(new) - hosts of role compute (group C(converged_compute)) that Slurm does not know.
  - C(repair) - such hosts that Slurm knows but that do not respond (C(NOT_RESPONDING), C(UNKNOWN)), whose features
    differ from the contract's C(converged_slurm_features), or whose record lost its C(MemSpecLimit) while the node is
    idle and not drained (a converge registers it again, which only an idle node can).
  - C(features) - of those, C({host, node, want, have}) where the features differ.
  - C(memory) - C({host, node, want, have}) where the record's C(MemSpecLimit) (absent is 0) is not the host's
    C(slurm_compute_mem_spec) (default 0). Slurm 22.05 forgets a dynamic node's C(MemSpecLimit) when slurmctld
    restarts or a backup takes over, and keeps everything else of its record.
  - C(memory_pending) - of those, the hosts whose node runs jobs or is drained, which keep the record as it is until
    it is idle (reported, not repaired, not a failure).
  - C(leaving) - hosts of C(converged_leaving_compute) whose Machine still holds our hook (scale-down's work),
    unless this run released it (host variable C(converged_hook_released)).
  - C(ghosts) - Slurm nodes with no Machine behind them that no longer respond and carry the feature of a
    node type of role compute; C(ghosts_alive) - the same but still responding (reported, left alone).
  - C(hint_unknown) - Machine names from an event or webhook payload that the inventory does not hold.
  - C(idle) - true when there is nothing to do.
positional: hostvars, groups, node_types, hook_key
options:
  _input:
    description: C(scontrol show node --oneliner) output lines (C(No nodes in the system) is none).
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars), after the contract.
    type: raw
    required: true
  groups:
    description: C(groups), after the contract.
    type: dict
    required: true
  node_types:
    description:
      - The names of the compute node types (C(converged_compute_node_types), which the contract leaves on the
        control node), or C(converged_node_types) itself.
    type: raw
    required: true
  hook_key:
    description: Our deletion hook's annotation key.
    type: str
    required: true
  hint:
    description:
      - Machines an event or a webhook named (a hint, never the truth), in any shape they arrive in - names, or
        Machines as the event source and the webhook body carry them (mappings with C(name)), lists of those, or a
        string (C(-e converged_reconcile_hint=a,b) or a YAML list).
    type: raw
    default: []
  capi_var:
    description: The inventory plugin's hostvar_name.
    type: str
    default: capi
"""

EXAMPLES = r"""
plan: >-
  {{ scontrol.stdout_lines | converged.hpc.reconcile_plan(hostvars, groups, converged_compute_node_types, hook_key) }}
"""

RETURN = r"""
_value:
  description: C(new), C(repair), C(features), C(memory), C(memory_pending), C(leaving), C(ghosts), C(ghosts_alive),
    C(hint_unknown), C(idle),
    C(slurm_nodes) (how many nodes Slurm knows).
  type: dict
"""

import yaml

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.collections import is_sequence
from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import parse_node


def parse_records(lines):
    """{node: {"state", "features", "responding", "down", "free", "mem_spec"}} from C(scontrol show node --oneliner)."""
    nodes = {}
    for line in lines or ():
        text = str(line).strip()
        if not text or text == "No nodes in the system":
            continue
        record = parse_node(text) if text.startswith("NodeName=") else {}
        if not record.get("NodeName") or "State" not in record:
            raise AnsibleFilterError("reconcile_plan: cannot read %r (want a line of scontrol show node --oneliner)"
                                     % text[:200])
        base, *flags = record["State"].split("+")
        responding = not ("NOT_RESPONDING" in flags or base == "UNKNOWN")
        features = record.get("AvailableFeatures", "")
        nodes[record["NodeName"]] = {
            "state": record["State"],
            "features": set() if features in ("", "(null)") else set(features.split(",")),
            "responding": responding,
            "down": base == "DOWN",
            # what the slurm_compute role calls free: idle, and neither drained nor draining
            "free": responding and base == "IDLE" and set(flags) <= {"DYNAMIC_NORM"},
            "mem_spec": record.get("MemSpecLimit", "0"),
        }
    return nodes


def mem_spec(host, hv):
    """The MemSpecLimit a host declares (slurm_compute_mem_spec, MiB, 0 for none), as a string."""
    value = hv.get("slurm_compute_mem_spec", 0)
    try:
        return str(int(value or 0))
    except (TypeError, ValueError):
        raise AnsibleFilterError("reconcile_plan: %s: slurm_compute_mem_spec %r is not a whole number of MiB"
                                 % (host, value))


def hint_names(hint):
    """Machine names from a hint in whatever shape it came: a name, "a,b", "[a, b]", {name: ...}, lists of those."""
    if hint is None:
        return set()
    if isinstance(hint, dict):
        return {str(hint["name"])} if hint.get("name") else set()
    if isinstance(hint, (str, bytes)):
        text = hint.decode() if isinstance(hint, bytes) else hint
        text = text.strip()
        if text.startswith(("[", "{")):
            try:
                return hint_names(yaml.safe_load(text))
            except yaml.YAMLError:
                pass
        return {part.strip().strip("'\"") for part in text.strip("[]").split(",") if part.strip().strip("'\"")}
    if is_sequence(hint):
        return set().union(*(hint_names(item) for item in hint)) if hint else set()
    return {str(hint)}


def reconcile_plan(lines, hostvars, groups, node_types, hook_key, hint=None, capi_var="capi"):
    if not isinstance(groups, dict):
        raise AnsibleFilterError("reconcile_plan: groups must be a dict")
    slurm = parse_records(lines)
    if isinstance(node_types, dict):
        compute_types = {name for name, spec in node_types.items()
                         if isinstance(spec, dict) and spec.get("role") == "compute"}
    else:  # the names of the compute node types (the contract's converged_compute_node_types)
        compute_types = {str(name) for name in node_types or ()}
    plan = {"new": [], "repair": [], "features": [], "memory": [], "memory_pending": [], "leaving": [], "ghosts": [],
            "ghosts_alive": [], "hint_unknown": [], "slurm_nodes": len(slurm)}
    ours, machines = set(), set()

    for host in groups.get("converged_compute") or ():
        hv = hostvars[host]
        node = hv.get("converged_slurm_node_name") or host
        ours.add(node)
        capi = hv.get(capi_var) if isinstance(hv.get(capi_var), dict) else {}
        machines.add(capi.get("name") or host)
        if node not in slurm:
            plan["new"].append(host)
            continue
        have = slurm[node]
        want = [str(f) for f in (hv.get("converged_slurm_features") or [hv.get("converged_node_type")]) if f]
        drift = set(want) != have["features"]
        if drift:
            plan["features"].append({"host": host, "node": node, "want": want, "have": sorted(have["features"])})
        declared = mem_spec(host, hv)
        lost = have["responding"] and have["mem_spec"] != declared
        if lost:
            plan["memory"].append({"host": host, "node": node, "want": declared, "have": have["mem_spec"]})
            if not have["free"]:
                plan["memory_pending"].append(host)
        if drift or not have["responding"] or (lost and have["free"]):
            plan["repair"].append(host)

    for host in groups.get("converged_leaving_compute") or ():
        hv = hostvars[host]
        ours.add(hv.get("converged_slurm_node_name") or host)
        capi = hv.get(capi_var) if isinstance(hv.get(capi_var), dict) else {}
        machines.add(capi.get("name") or host)
        if hook_key in (capi.get("annotations") or {}) and not hv.get("converged_hook_released"):
            plan["leaving"].append(host)

    for host in groups.get("converged_slurm", []) + groups.get("converged_leaving", []):
        capi = hostvars[host].get(capi_var)
        machines.add(capi.get("name") if isinstance(capi, dict) and capi.get("name") else host)

    for node, have in sorted(slurm.items()):
        if node in ours or not (have["features"] & compute_types):
            continue
        gone = not have["responding"] or have["down"]
        plan["ghosts" if gone else "ghosts_alive"].append(node)

    plan["hint_unknown"] = sorted(name for name in hint_names(hint) if name not in machines)
    plan["idle"] = not (plan["new"] or plan["repair"] or plan["leaving"] or plan["ghosts"])
    return plan


class FilterModule(object):
    def filters(self):
        return {"reconcile_plan": reconcile_plan}
