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
  - Input is the output lines of C(sinfo --noheader --Node --format '%N|%t|%f') (a node once per partition is
    fine). Returns what differs, each as a list
  - C(new) - hosts of role compute (group C(converged_compute)) that Slurm does not know.
  - C(repair) - such hosts that Slurm knows but that do not respond (state C(*), C(unk)), or whose features
    differ from the contract's C(converged_slurm_features).
  - C(features) - of those, C({host, node, want, have}) where the features differ.
  - C(leaving) - hosts of C(converged_leaving_compute) whose Machine still holds our hook (scale-down's work),
    unless this run released it (host variable C(converged_hook_released)).
  - C(ghosts) - Slurm nodes with no Machine behind them that no longer respond and carry the feature of a
    node type of role compute; C(ghosts_alive) - the same but still responding (reported, left alone).
  - C(hint_unknown) - Machine names from an event or webhook payload that the inventory does not hold.
  - C(idle) - true when there is nothing to do.
positional: hostvars, groups, node_types, hook_key
options:
  _input:
    description: C(sinfo) output lines.
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
  {{ sinfo.stdout_lines | converged.hpc.reconcile_plan(hostvars, groups, converged_compute_node_types, hook_key) }}
"""

RETURN = r"""
_value:
  description: C(new), C(repair), C(features), C(leaving), C(ghosts), C(ghosts_alive), C(hint_unknown), C(idle),
    C(slurm_nodes) (how many nodes Slurm knows).
  type: dict
"""

import yaml

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.collections import is_sequence


def parse_sinfo(lines):
    """{node: {"state": compact state, "features": set}} from `sinfo -N -h -o '%N|%t|%f'` lines."""
    nodes = {}
    for line in lines or ():
        parts = str(line).strip().split("|")
        if len(parts) != 3 or not parts[0]:
            if str(line).strip():
                raise AnsibleFilterError("reconcile_plan: cannot read sinfo line %r (want 'name|state|features')"
                                         % str(line))
            continue
        name, state, features = parts
        have = set() if features in ("", "(null)") else set(features.split(","))
        nodes[name] = {"state": state, "features": have}
    return nodes


def responding(state):
    """sinfo's compact state: a trailing * means the node does not respond; unk: it never registered."""
    return not (state.endswith("*") or state.startswith("unk"))


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
    slurm = parse_sinfo(lines)
    if isinstance(node_types, dict):
        compute_types = {name for name, spec in node_types.items()
                         if isinstance(spec, dict) and spec.get("role") == "compute"}
    else:  # the names of the compute node types (the contract's converged_compute_node_types)
        compute_types = {str(name) for name in node_types or ()}
    plan = {"new": [], "repair": [], "features": [], "leaving": [], "ghosts": [], "ghosts_alive": [],
            "hint_unknown": [], "slurm_nodes": len(slurm)}
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
        if drift or not responding(have["state"]):
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
        gone = not responding(have["state"]) or have["state"].startswith("down")
        plan["ghosts" if gone else "ghosts_alive"].append(node)

    plan["hint_unknown"] = sorted(name for name in hint_names(hint) if name not in machines)
    plan["idle"] = not (plan["new"] or plan["repair"] or plan["leaving"] or plan["ghosts"])
    return plan


class FilterModule(object):
    def filters(self):
        return {"reconcile_plan": reconcile_plan}
