# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where a rollout of a compute MachineDeployment stands, and which old node goes next."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: rollout_plan
short_description: Decide the next step of a rollout of a compute MachineDeployment (playbooks/rollout.yml)
version_added: 0.9.0
author: converged.hpc contributors (@converged-hpc)
description:
  - A rollout replaces the Machines of one MachineDeployment whose template changed (a new
    Metal3MachineTemplate, new bootstrap data). The MachineDeployment's strategy is C(OnDelete), so
    Cluster API replaces a Machine only when it is deleted, and the collection deletes them in its own
    order (docs/upgrades.md).
  - A Machine is old when the MachineSet that owns it has another template or bootstrap data than the
    target; new otherwise. A new Machine has joined when its Slurm node is in service (in Slurm, not down,
    drained, failing or not responding).
  - The next old Machine is one whose Machine is being deleted already (a run that stopped half-way),
    then one whose node is out of service, then an idle one, then the one whose jobs end soonest by their
    time limits. It is taken only when the nodes still in service after it are at least C(replicas -
    max_unavailable).
  - Nothing is decided when the request is wrong; RV(_value.errors) names the bad value.
positional: deployment, machinesets, machines, templates
options:
  _input:
    description:
      - The request - C(template), C(bootstrap) (either may be empty - the MachineDeployment's current one),
        C(back) (go back to the template the last rollout came from), C(max_unavailable), C(join_timeout)
        (seconds a new Machine may take to join before the rollout stops).
    type: dict
    required: true
  deployment:
    description: The MachineDeployment, as the API returns it.
    type: dict
    required: true
  machinesets:
    description: Its MachineSets.
    type: list
    elements: dict
    required: true
  machines:
    description: Its Machines.
    type: list
    elements: dict
    required: true
  templates:
    description: The names of the Metal3MachineTemplates of its namespace.
    type: list
    elements: str
    required: true
  nodes:
    description: Slurm's nodes as converged.hpc.slurm_queue returns them.
    type: list
    elements: dict
    default: []
  running:
    description: The running jobs as converged.hpc.slurm_queue returns them (with O(running)).
    type: list
    elements: dict
    default: []
  node_names:
    description: The Slurm node name of a Machine, by Machine name (the contract's); else its C(Hostname) address.
    type: dict
    default: {}
  now:
    description: The time (epoch seconds) to age new Machines by.
    type: float
    default: 0
  hook:
    description:
      - Our deletion hook's annotation. An old Machine being deleted that no longer holds it is leaving on its
        own (its node out of Slurm already) and is left out; empty keeps every Machine.
    type: str
    default: ""
"""

EXAMPLES = r"""
plan: >-
  {{ {'template': 'hpc-compute-v2', 'max_unavailable': 1, 'join_timeout': 600}
     | converged.hpc.rollout_plan(md, pool.machinesets, pool.machines, pool.templates | map(attribute='metadata.name'),
                                  nodes=queue.nodes, running=queue.running, now=queue.now) }}
"""

RETURN = r"""
_value:
  description:
    - C(errors) - why the request cannot be followed (empty when it can).
    - C(target), C(previous) - C({template, bootstrap}) rolled to and the one it comes from; C(resuming) - a
      rollout to the same target was under way (the MachineDeployment's note); C(note) - that note.
    - C(old) - the old Machines in the order they go, each C({machine, node, in_service, busy, end, deleting});
      C(new) - the new Machines, each C({machine, node, joined, age}); C(unjoined) - the new Machines not
      joined yet; C(overdue) - those not joined within C(join_timeout).
    - C(replicas), C(in_service), C(floor) - the nodes the site allows at the least.
    - C(next) - the old Machine to take now (empty - none may go yet); C(done) - no old Machine left and
      every replica's node joined; C(stop) - the rollout cannot go on (a new Machine overdue, or too few nodes
      in service with nothing to wait for); C(why) - one line saying what the rollout waits for, or why it cannot go on.
  type: dict
"""

import calendar
import json
import time

from ansible.errors import AnsibleFilterError

NOTE = "converged.hpc/rollout"
OUT_STATES = frozenset(("DOWN", "FUTURE", "UNKNOWN", "DRAINED", "DRAINING"))
OUT_FLAGS = frozenset(("DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "FAIL", "POWERED_DOWN", "POWERING_DOWN",
                       "POWERING_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED"))


def in_service(node):
    """A Slurm node (slurm_queue's record) that runs or can run jobs. A node in a maintenance reservation
    still runs the jobs it has: it counts."""
    if not node:
        return False
    flags = set(node.get("flags") or [])
    return node.get("state") not in OUT_STATES and not OUT_FLAGS.intersection(flags)


def template_of(spec):
    spec = spec or {}
    return {"template": ((spec.get("infrastructureRef") or {}).get("name") or ""),
            "bootstrap": ((spec.get("bootstrap") or {}).get("dataSecretName") or "")}


def read_note(deployment):
    text = ((deployment.get("metadata") or {}).get("annotations") or {}).get(NOTE)
    if not text:
        return {}
    try:
        note = json.loads(text)
    except ValueError:
        return {}
    return note if isinstance(note, dict) else {}


def created_at(obj):
    stamp = (obj.get("metadata") or {}).get("creationTimestamp") or ""
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


def hostname(machine):
    for address in (machine.get("status") or {}).get("addresses") or []:
        if address.get("type") == "Hostname" and address.get("address"):
            return address["address"]
    return None


def as_int(request, key, errors, least):
    value = request.get(key)
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < least:
        errors.append("converged_rollout_%s=%r: expected a whole number, at least %d" % (key, value, least))
        return least
    return int(text)


def target_of(request, deployment, note, templates, errors):
    """(target, previous, resuming) of the request."""
    meta = deployment.get("metadata") or {}
    current = template_of(((deployment.get("spec") or {}).get("template") or {}).get("spec"))
    # a rollout under way, or stopped (asked again: it stops again until the site goes back or fixes the cause)
    running = note.get("state") in ("running", "stopped") and isinstance(note.get("to"), dict)
    if request.get("back"):
        if running and note.get("back"):  # a way back under way: go on with it
            return dict(note["to"]), dict(note.get("from") or current), True
        if not isinstance(note.get("from"), dict) or not note["from"].get("template"):
            errors.append("converged_rollout_back: MachineDeployment %s has no rollout to go back from (no %s note)"
                          % (meta.get("name"), NOTE))
            return current, current, False
        return dict(note["from"]), current, False
    if not request.get("template") and not request.get("bootstrap"):
        errors.append("name the new template (converged_rollout_template, a Metal3MachineTemplate) or bootstrap "
                      "data (converged_rollout_bootstrap, a Secret), or go back (converged_rollout_back=true)")
        return current, current, False
    target = {"template": request.get("template") or current["template"],
              "bootstrap": request.get("bootstrap") or current["bootstrap"]}
    if target["template"] not in templates:
        errors.append("converged_rollout_template=%s: no such Metal3MachineTemplate in namespace %s (it has %s)"
                      % (target["template"], meta.get("namespace"), ", ".join(sorted(templates)) or "none"))
    resuming = running and note.get("to") == target
    return target, (dict(note.get("from") or current) if resuming else current), resuming


def rollout_plan(request, deployment, machinesets, machines, templates, nodes=None, running=None, node_names=None,
                 now=0, hook=""):
    if not isinstance(request, dict) or not isinstance(deployment, dict):
        raise AnsibleFilterError("rollout_plan: expected a request and a MachineDeployment (dicts)")
    errors = []
    note = read_note(deployment)
    target, previous, resuming = target_of(request, deployment, note, list(templates or []), errors)
    max_unavailable = as_int(request, "max_unavailable", errors, 1)
    join_timeout = as_int(request, "join_timeout", errors, 1)
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    by_node = dict((n.get("name"), n) for n in nodes or [])
    names = node_names or {}
    ends = {}
    for job in running or []:
        for node in job.get("nodes") or []:
            ends.setdefault(node, []).append(job.get("end"))
    set_template = {}
    for ms in machinesets or []:
        set_template[ms["metadata"]["name"]] = template_of(((ms.get("spec") or {}).get("template") or {}).get("spec"))
    old, new = [], []
    for machine in machines or []:
        meta = machine.get("metadata") or {}
        owner = next((ref.get("name") for ref in meta.get("ownerReferences") or [] if ref.get("kind") == "MachineSet"),
                     None)
        node = names.get(meta.get("name")) or hostname(machine)
        deleting = bool(meta.get("deletionTimestamp"))
        if deleting and hook and hook not in (meta.get("annotations") or {}):
            continue
        if set_template.get(owner, template_of(machine.get("spec"))) != target:
            job_ends = ends.get(node, [])
            old.append({"machine": meta.get("name"), "node": node, "in_service": in_service(by_node.get(node)),
                        "busy": bool(job_ends), "deleting": deleting,
                        "end": None if not job_ends or None in job_ends else max(job_ends)})
        elif not deleting:
            born = created_at(machine)
            joined = node is not None and in_service(by_node.get(node))
            new.append({"machine": meta.get("name"), "node": node, "joined": joined,
                        "age": int(now - born) if born is not None and now else 0})
    old.sort(key=lambda m: (not m["deleting"], m["in_service"], m["busy"],
                            m["end"] if m["end"] is not None else float("inf"), m["machine"]))
    staying = [m for m in old if not m["deleting"]]
    serving = len([m for m in staying if m["in_service"]]) + len([m for m in new if m["joined"]])
    floor = max(0, replicas - max_unavailable)
    unjoined = [m["machine"] for m in new if not m["joined"]]
    overdue = [m["machine"] for m in new if not m["joined"] and m["age"] >= join_timeout]
    plan = {"errors": errors, "target": target, "previous": previous, "resuming": resuming, "note": note,
            "old": old, "new": new, "unjoined": unjoined, "overdue": overdue, "replicas": replicas,
            "in_service": serving, "floor": floor, "next": "", "why": "", "stop": False,
            "done": not old and len([m for m in new if m["joined"]]) >= replicas}
    if errors or plan["done"]:
        plan["why"] = "; ".join(errors) if errors else "every Machine runs the target and its node is in service"
        return plan
    if overdue:
        plan["why"] = "new Machine(s) %s did not join Slurm within %d s" % (", ".join(overdue), join_timeout)
        plan["stop"] = True
        return plan
    if old:
        first = old[0]
        if first["deleting"] or serving - (1 if first["in_service"] else 0) >= floor:
            plan["next"] = first["machine"]
            plan["why"] = "take %s (node %s: %s)" % (
                first["machine"], first["node"], "its Machine is being deleted already" if first["deleting"]
                else "out of service" if not first["in_service"] else "busy until its jobs end" if first["busy"]
                else "idle")
        elif unjoined:
            plan["why"] = "wait for new Machine(s) %s to join (%d of %d nodes in service, at least %d allowed)" % (
                ", ".join(unjoined), serving, replicas, floor)
        else:
            plan["stop"] = True
            plan["why"] = ("only %d of %d nodes in service and no new Machine to wait for: taking %s would leave %d, "
                           "fewer than the %d allowed" % (serving, replicas, first["machine"], serving - 1, floor))
    else:
        plan["why"] = "wait for new Machine(s) %s to join" % ", ".join(unjoined) if unjoined else \
            "wait for Cluster API to make the new Machines (%d of %d)" % (len(new), replicas)
    return plan


class FilterModule(object):
    def filters(self):
        return {"rollout_plan": rollout_plan}
