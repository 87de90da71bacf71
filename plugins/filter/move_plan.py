# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which bare-metal hosts a move takes from one MachineDeployment to another, and whether it can work."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: move_plan
short_description: Choose the hosts a move takes between two MachineDeployments of one bare-metal pool
version_added: 0.6.0
author: converged.hpc contributors (@converged-hpc)
description:
  - A move gives hosts of the source MachineDeployment back to the pool and lets the target claim exactly
    those - each chosen host is labelled O(pool_label) with the target's name once it is available, and the
    target's Metal3MachineTemplate selects hosts by that label (docs/converged.md).
  - The request names the source (C(from)), the target (C(to)) and one of C(count) (that many hosts, idle
    Slurm nodes first), C(hosts) (BareMetalHost, Machine or host names) or C(label) (C(key=value) on the
    BareMetalHosts, e.g. C(gpu=true)).
  - Nothing is decided when the move cannot work; RV(_value.errors) says why, naming the bad value - an
    unknown MachineDeployment or template, a host that is not the source's, fewer hosts than asked, a host
    the target's C(hostSelector) would not claim once labelled (its hardware is not the target's) or the
    source's would claim again, the target's maximum or the source's minimum (the Cluster API autoscaler's
    C(node-group-max-size) and C(node-group-min-size) annotations).
positional: deployments, templates, hosts, machines
options:
  _input:
    description: The request, C({from, to, count | hosts | label}), optionally C(namespace) (default C(metal3)).
    type: dict
    required: true
  deployments:
    description: The MachineDeployments (objects as the API returns them).
    type: list
    elements: dict
    required: true
  templates:
    description: The Metal3MachineTemplates.
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
  nodes:
    description: Slurm's node states by node name (C(idle), C(alloc)...), to take idle nodes first.
    type: dict
    default: {}
  pool_label:
    description: The host label the templates select a side by.
    type: str
    default: converged.hpc/pool
  slurm_node_types:
    description: The node types that are Slurm nodes (the contract's compute node types).
    type: list
    elements: str
    default: []
  hook:
    description: Our deletion hook's annotation; a Slurm source Machine without it is refused (its host would be
      deprovisioned under its jobs).
    type: str
    default: ""
  node_type_label:
    description: The MachineDeployment template's label that names the node type.
    type: str
    default: node-type
"""

EXAMPLES = r"""
plan: "{{ {'from': 'hpc-gpu', 'to': 'k8s-gpu', 'count': 1} | converged.hpc.move_plan(mds, templates, bmhs, machines) }}"
"""

RETURN = r"""
_value:
  description:
    - C(errors) - why the move cannot work (empty when it can).
    - C(source), C(target) - C({namespace, name, replicas, desired, node_type, slurm}).
    - C(hosts) - the BareMetalHosts moved; C(machines) - the source's Machines on them (to mark with
      C(cluster.x-k8s.io/delete-machine)); C(labels) - the label each host gets once it is available.
    - C(line) - one line saying what the move does.
  type: dict
"""

import json

from ansible.errors import AnsibleFilterError

MAX_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"
MIN_SIZE = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
OPERATORS = ("in", "notin", "exists", "!", "=", "==", "!=", "gt", "lt")


def selector_matches(selector, labels):
    """A Metal3MachineTemplate's hostSelector against a host's labels, as CAPM3 builds it (operators
    lower-cased); None for an operator it cannot build."""
    labels = labels or {}
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, values = expr.get("key"), expr.get("values") or []
        op = str(expr.get("operator", "")).lower()
        if op not in OPERATORS:
            return None
        present = key in labels
        if op in ("in", "=", "==") and (not present or labels[key] not in values):
            return False
        if (op in ("notin", "!=") and present and labels[key] in values) or (op == "exists" and not present) \
                or (op == "!" and present):
            return False
        if op in ("gt", "lt"):
            try:
                have, want = int(labels[key]), int(values[0])
            except (KeyError, ValueError, IndexError):
                return False
            if (op == "gt" and have <= want) or (op == "lt" and have >= want):
                return False
    return True


def _find(objects, namespace, name):
    return next((o for o in objects if o["metadata"].get("namespace") == namespace
                 and o["metadata"]["name"] == name), None)


def _check_request(request):
    errors = []
    for side in ("from", "to"):
        if not isinstance(request.get(side), str) or not request.get(side):
            errors.append("'%s' must name a MachineDeployment, got %r" % (side, request.get(side)))
    if not errors and request["from"] == request["to"]:
        errors.append("'from' and 'to' are the same MachineDeployment (%s)" % request["from"])
    chosen = [k for k in ("count", "hosts", "label") if request.get(k) not in (None, "", [])]
    if len(chosen) != 1:
        errors.append("give exactly one of count, hosts or label (given: %s)" % (", ".join(chosen) or "none"))
    elif chosen == ["count"]:
        count = request["count"]
        if isinstance(count, bool) or not str(count).isdigit() or int(count) < 1:
            errors.append("count must be a positive integer, got %r" % (count,))
    elif chosen == ["hosts"]:
        hosts = request["hosts"]
        if isinstance(hosts, str):
            hosts = [h.strip() for h in hosts.split(",")]
        if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
            errors.append("hosts must be a list of host names, got %r" % (request["hosts"],))
    elif "=" not in str(request["label"]) or not str(request["label"]).split("=", 1)[0]:
        errors.append("label must be key=value, got %r" % (request["label"],))
    return errors


def _side(deployments, templates, namespace, name, role, errors):
    md = _find(deployments, namespace, name)
    if md is None:
        errors.append("%s MachineDeployment %s/%s does not exist" % (role, namespace, name))
        return None, None
    ref = (((md.get("spec") or {}).get("template") or {}).get("spec") or {}).get("infrastructureRef") or {}
    template = _find(templates, namespace, ref.get("name", "")) if ref.get("kind") == "Metal3MachineTemplate" else None
    if template is None:
        errors.append("%s MachineDeployment %s/%s does not take its hosts from a pool: its infrastructureRef is %s %s, "
                      "not a Metal3MachineTemplate that exists" % (role, namespace, name, ref.get("kind"),
                                                                   ref.get("name")))
    return md, template


def _selector(template):
    return (((template or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get("hostSelector")


def _candidates(namespace, source, hosts, machines):
    """(host, machine, node name) of the source's live Machines on provisioned hosts, by host name."""
    name = source["metadata"]["name"]
    ours = {}
    for machine in machines:
        meta = machine["metadata"]
        if meta.get("namespace") != namespace or meta.get("deletionTimestamp") \
                or (meta.get("labels") or {}).get("cluster.x-k8s.io/deployment-name") != name:
            continue
        infra = ((machine.get("spec") or {}).get("infrastructureRef") or {}).get("name", meta["name"])
        ours[infra] = machine
    out = []
    for host in hosts:
        if host["metadata"].get("namespace") != namespace:
            continue
        consumer = ((host.get("spec") or {}).get("consumerRef") or {}).get("name")
        if consumer in ours:
            machine = ours[consumer]
            node = next((a["address"] for a in (machine.get("status") or {}).get("addresses") or []
                         if a.get("type") == "Hostname"), host["metadata"]["name"])
            out.append((host, machine, node))
    return sorted(out, key=lambda c: c[0]["metadata"]["name"])


def _node_type(md, label):
    return ((((md.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels") or {}).get(label, "")


def move_plan(request, deployments, templates, hosts, machines, nodes=None, pool_label="converged.hpc/pool",
              slurm_node_types=(), hook="", node_type_label="node-type"):
    """See DOCUMENTATION."""
    if not isinstance(request, dict):
        raise AnsibleFilterError("move_plan: the request must be a dict {from, to, count | hosts | label}, got %r"
                                 % (request,))
    nodes = nodes or {}
    namespace = request.get("namespace") or "metal3"
    errors = _check_request(request)
    out = {"errors": errors, "hosts": [], "machines": [], "labels": {}, "source": None, "target": None, "line": ""}
    if errors:
        return out
    source, source_template = _side(deployments, templates, namespace, request["from"], "the source", errors)
    target, target_template = _side(deployments, templates, namespace, request["to"], "the target", errors)
    if errors:
        return out
    candidates = _candidates(namespace, source, hosts, machines)
    if request.get("count") not in (None, ""):
        count = int(request["count"])
        # idle Slurm nodes first (a busy one moves after its jobs end), then by name
        ordered = sorted(candidates, key=lambda c: (str(nodes.get(c[2], "idle")).lower().rstrip("*~#!%$@^-") != "idle",
                                                    c[0]["metadata"]["name"]))
        chosen = ordered[:count]
        if len(chosen) < count:
            errors.append("%s/%s has %d host(s) to move, %d asked"
                          % (namespace, request["from"], len(candidates), count))
    elif request.get("hosts") not in (None, "", []):
        wanted = request["hosts"]
        wanted = [h.strip() for h in wanted.split(",")] if isinstance(wanted, str) else list(wanted)
        chosen = []
        for name in wanted:
            found = next((c for c in candidates if name in (c[0]["metadata"]["name"], c[1]["metadata"]["name"], c[2])),
                         None)
            if found is None:
                errors.append("host %s is not one of %s/%s's (%s)" % (
                    name, namespace, request["from"], ", ".join(c[0]["metadata"]["name"] for c in candidates) or "none"))
            elif found not in chosen:
                chosen.append(found)
    else:
        key, value = str(request["label"]).split("=", 1)
        chosen = [c for c in candidates if (c[0]["metadata"].get("labels") or {}).get(key) == value]
        if not chosen:
            errors.append("no host of %s/%s has the label %s" % (namespace, request["from"], request["label"]))
    labels = {pool_label: request["to"]}
    for host, dummy, dummy2 in chosen:
        relabelled = dict(host["metadata"].get("labels") or {}, **labels)
        claims = selector_matches(_selector(target_template), relabelled)
        if claims is None:
            errors.append("the target's hostSelector has an operator CAPM3 cannot build: %s" % _selector(target_template))
        elif not claims:
            errors.append("host %s labelled %s=%s is not one %s's hostSelector claims (%s): its labels %s" % (
                host["metadata"]["name"], pool_label, request["to"], request["to"], _selector(target_template),
                relabelled))
        if selector_matches(_selector(source_template), relabelled):
            errors.append("host %s labelled %s=%s would still be claimed by %s's hostSelector (%s): the source must "
                          "select its hosts by %s" % (host["metadata"]["name"], pool_label, request["to"],
                                                      request["from"], _selector(source_template), pool_label))
    source_type, target_type = _node_type(source, node_type_label), _node_type(target, node_type_label)
    if hook and source_type in slurm_node_types:
        unhooked = [c[1]["metadata"]["name"] for c in chosen if hook not in (c[1]["metadata"].get("annotations") or {})]
        if unhooked:
            errors.append("the Machine(s) %s of %s lack our deletion hook %s: Cluster API would deprovision the host "
                          "under its running jobs; converge them (site.yml or scale_up.yml puts the hook) and move "
                          "again" % (", ".join(unhooked), request["from"], hook))
    moved = len(chosen)
    source_replicas = int((source.get("spec") or {}).get("replicas") or 0)
    target_replicas = int((target.get("spec") or {}).get("replicas") or 0)
    bounds = ((target, target_replicas + moved, MAX_SIZE, "maximum"),
              (source, source_replicas - moved, MIN_SIZE, "minimum"))
    for md, wanted_replicas, annotation, word in bounds:
        bound = (md["metadata"].get("annotations") or {}).get(annotation)
        if bound is None:
            continue
        try:
            bound = int(bound)
        except ValueError:
            errors.append("%s's %s annotation %s is not a number: %r"
                          % (md["metadata"]["name"], word, annotation, bound))
            continue
        if (word == "maximum" and wanted_replicas > bound) or (word == "minimum" and wanted_replicas < bound):
            errors.append("%s would have %d replicas, beyond its %s %d (%s)" % (
                md["metadata"]["name"], wanted_replicas, word, bound, annotation))
    if errors:
        return out
    out.update(
        hosts=[c[0]["metadata"]["name"] for c in chosen], machines=[c[1]["metadata"]["name"] for c in chosen],
        labels=labels,
        source={"namespace": namespace, "name": request["from"], "replicas": source_replicas,
                "desired": source_replicas - moved, "node_type": source_type,
                "slurm": source_type in slurm_node_types},
        target={"namespace": namespace, "name": request["to"], "replicas": target_replicas,
                "desired": target_replicas + moved, "node_type": target_type,
                "slurm": target_type in slurm_node_types})
    out["line"] = "move %s: %s %d -> %d, %s %d -> %d" % (
        ", ".join(out["hosts"]), request["from"], source_replicas, source_replicas - moved, request["to"],
        target_replicas, target_replicas + moved)
    return out


def _replicas(md):
    return int(((md or {}).get("spec") or {}).get("replicas") or 0)


def _names(value):
    return isinstance(value, list) and all(isinstance(n, str) and n for n in value)


def _short(value, most=120):
    text = repr(value)
    return text if len(text) <= most else text[:most] + "... (%d characters)" % len(text)


def intent_problem(intent):
    """What makes intent no move's intent as move.yml writes it (a note changed by hand), or None."""
    if not isinstance(intent, dict):
        return "not a mapping"
    missing = [k for k in ("from", "to", "hosts", "source", "target") if k not in intent]
    if missing:
        return "no %s" % ", ".join(missing)
    for key in ("from", "to"):
        if not isinstance(intent[key], str) or not intent[key]:
            return "%s is %s, not a MachineDeployment's name" % (key, _short(intent[key]))
    if not _names(intent["hosts"]) or not intent["hosts"]:
        return "hosts is %s, not a list of host names" % (_short(intent["hosts"]),)
    if "machines" in intent and not _names(intent["machines"]):
        return "machines is %s, not a list of Machine names" % (_short(intent["machines"]),)
    for key in ("namespace", "api_version"):
        if key in intent and not isinstance(intent[key], str):
            return "%s is %s, not a string" % (key, _short(intent[key]))
    for side in ("source", "target"):
        counts = intent[side]
        if not isinstance(counts, dict) or not all(
                isinstance(counts.get(k), int) and not isinstance(counts.get(k), bool) and counts[k] >= 0
                for k in ("replicas", "desired")):
            return "%s is %s, not its replicas and desired counts" % (side, _short(counts))
    return None


def move_progress(intent, deployments, hosts, machines, pool_label="converged.hpc/pool", hook=None):
    """What a move (its intent, as move.yml writes it on the target) still has to do; see move_progress.yml.
    With C(hook) (our deletion hook's annotation), C(held) names the moving Machines that still carry it: a
    Slurm node scale_down.yml has not released yet."""
    problem = intent_problem(intent)
    if problem:
        raise AnsibleFilterError("move_progress: not a move's intent (%s): %s" % (problem, _short(intent, 500)))
    namespace = intent.get("namespace") or "metal3"
    out = {"errors": [], "scale_source": False, "delete_machines": [], "waiting": {}, "to_label": [],
           "labelled": [], "scale_target": False, "claimed": [], "unclaimed": [], "held": [], "done": False}
    sides = {}
    for side, name in (("source", intent["from"]), ("target", intent["to"])):
        md = _find(deployments, namespace, name)
        if md is None:
            out["errors"].append("the move's %s MachineDeployment %s/%s no longer exists" % (side, namespace, name))
            continue
        have, before, after = _replicas(md), int(intent[side]["replicas"]), int(intent[side]["desired"])
        if have not in (before, after):
            out["errors"].append("%s/%s has %d replicas, neither the %d the move found nor the %d it wants: it was "
                                 "scaled meanwhile; scale it back to %d or %d and run again" % (
                                     namespace, name, have, before, after, before, after))
        sides[side] = (have, before, after)
    if out["errors"]:
        return out
    out["scale_source"] = sides["source"][0] != sides["source"][2]
    by_name = dict(((m["metadata"].get("namespace"), m["metadata"]["name"]), m) for m in machines)
    out["delete_machines"] = [n for n in intent.get("machines") or []
                              if (namespace, n) in by_name and not by_name[(namespace, n)]["metadata"].get(
                                  "deletionTimestamp")]
    if hook:
        out["held"] = [n for n in intent.get("machines") or [] if (namespace, n) in by_name
                       and hook in (by_name[(namespace, n)]["metadata"].get("annotations") or {})]
    # a host's consumerRef names the Metal3Machine, the Machine's infrastructureRef
    target_machines = dict((((m.get("spec") or {}).get("infrastructureRef") or {}).get("name", m["metadata"]["name"]), m)
                           for m in machines if m["metadata"].get("namespace") == namespace
                           and (m["metadata"].get("labels") or {}).get("cluster.x-k8s.io/deployment-name")
                           == intent["to"])
    for name in intent["hosts"]:
        host = _find(hosts, namespace, name)
        if host is None:
            out["errors"].append("the move's host %s/%s no longer exists" % (namespace, name))
            continue
        labels = host["metadata"].get("labels") or {}
        state = ((host.get("status") or {}).get("provisioning") or {}).get("state", "")
        consumer = ((host.get("spec") or {}).get("consumerRef") or {}).get("name")
        if labels.get(pool_label) == intent["to"]:
            out["labelled"].append(name)
            machine = target_machines.get(consumer)
            status = (machine or {}).get("status") or {}
            if machine is not None and not machine["metadata"].get("deletionTimestamp") and (
                    status.get("nodeRef") or status.get("phase") in ("Provisioned", "Running")):
                out["claimed"].append(name)
            else:
                out["unclaimed"].append(name)
        elif state in ("available", "ready") and not consumer:
            out["to_label"].append(name)
        else:
            out["waiting"][name] = (state or "unknown") + (" (consumer %s)" % consumer if consumer else "")
    out["scale_target"] = sides["target"][0] != sides["target"][2]
    out["done"] = not out["errors"] and not out["scale_source"] and not out["scale_target"] \
        and len(out["claimed"]) == len(intent["hosts"])
    return out


def move_pending(deployments, key="converged.hpc/move"):
    """The move a run left unfinished: the note (key) on the first MachineDeployment that carries one, or {}."""
    for md in sorted(deployments, key=lambda d: (d["metadata"].get("namespace", ""), d["metadata"]["name"])):
        note = (md["metadata"].get("annotations") or {}).get(key)
        if note is None:
            continue
        try:
            intent = json.loads(note)
        except ValueError:
            intent = None
        where = "%s/%s" % (md["metadata"].get("namespace"), md["metadata"]["name"])
        if not isinstance(intent, dict):
            raise AnsibleFilterError("MachineDeployment %s: its annotation %s is not a move's note (JSON): %s; "
                                     "take it off by hand once the move it was is done" % (where, key, _short(note, 500)))
        problem = intent_problem(intent)
        if problem is None and intent["to"] != md["metadata"]["name"]:
            problem = "it names %s as the move's target, and sits on %s" % (_short(intent["to"]), md["metadata"]["name"])
        if problem:
            raise AnsibleFilterError("MachineDeployment %s: its annotation %s is not a move's note as move.yml "
                                     "writes it (%s): %s; the move it was is not taken on. Put it back as it was, or take it "
                                     "off by hand once the move it was is done" % (where, key, problem, _short(note, 500)))
        return intent
    return {}


class FilterModule(object):
    def filters(self):
        return {"move_plan": move_plan, "move_progress": move_progress, "move_pending": move_pending}
