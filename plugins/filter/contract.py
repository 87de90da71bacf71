# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The contract from Cluster API node types to Slurm, applied to an inventory."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: contract
short_description: Sort inventory hosts into the collection's groups by the node-type contract
version_added: 0.2.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Reads each host's node type (C(converged_node_type) when set, else C(<capi_var>.node_type) from
    the converged.hpc.capi_machines inventory, else the name of the node-type group the host is in, for
    static inventories) and returns what the contract (C(converged_node_types)) makes of it - the
    collection's groups, the host's Slurm node name, nodeset and features - or the errors that stop a run.
  - The role's C(tasks/contract.yml) turns the result into groups with C(ansible.builtin.add_host),
    before any change. See docs/contract.md.
positional: groups, node_types, partitions
options:
  _input:
    description: C(hostvars).
    type: raw
    required: true
  groups:
    description: C(groups).
    type: dict
    required: true
  node_types:
    description: The contract, C(converged_node_types).
    type: dict
    required: true
  partitions:
    description: C(converged_partitions).
    type: list
    elements: dict
    required: true
  cluster:
    description:
      - The Cluster API cluster to take hosts from (C(converged_cluster)). Empty means the cluster of the
        O(play_hosts), which must be one; hosts without a cluster (static inventories) are always taken.
    type: str
    default: ""
  play_hosts:
    description: The hosts of the play (C(ansible_play_hosts_all)), after C(--limit).
    type: list
    elements: str
    default: []
  capi_var:
    description: The inventory plugin's O(converged.hpc.capi_machines#inventory:hostvar_name).
    type: str
    default: capi
  feature_label_prefix:
    description:
      - Machine labels under this prefix become Slurm features of a compute host (C(converged_slurm_features),
        after its node type); a label whose value is C(false), C(no) or C(0) does not.
    type: str
    default: feature.slurm.converged.hpc/
  accounting:
    description:
      - Accounting is on (C(converged_accounting)) - one host is chosen to run slurmdbd and its database,
        and put in the group C(converged_slurmdbd).
    type: bool
    default: false
  accounting_node_type:
    description:
      - The node type whose first host (by name, not being deleted) runs slurmdbd (C(converged_accounting_node_type)).
      - Empty means a node type with role C(accounting) that has a host, else the controller node type.
    type: str
    default: ""
  gres_annotation:
    description:
      - The Machine annotation that declares a compute host's generic resources, as Slurm writes them
        (C(gpu:a100:4), C(gpu:2,nvme:1)); it wins over the node type's C(gres). The host's C(converged_slurm_gres).
    type: str
    default: slurm.converged.hpc/gres
"""

EXAMPLES = r"""
contract: >-
  {{ hostvars | converged.hpc.contract(groups, converged_node_types, converged_partitions,
                                       cluster='hpc') }}
"""

RETURN = r"""
_value:
  description: C(errors) (a list of sentences), C(hosts) (name, groups, vars of each Slurm host, by Slurm node name, so the first controller is the primary),
    C(nodesets) (name, feature, partitions), C(ignored) (hosts of node types the contract does not know),
    C(slurmdbd) (the host that runs slurmdbd, empty when accounting is off), C(gres_types) (every GRES name
    the node types and hosts declare, for GresTypes).
  type: dict
"""

import re

from ansible.errors import AnsibleFilterError

ROLES = ("controller", "compute", "login", "accounting")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
GROUP = "converged_%s"  # converged_controller, converged_compute, converged_login, converged_accounting
SLURMDBD = "converged_slurmdbd"
LEAVING = "converged_leaving"
ALL = "converged_slurm"
FEATURE_LABEL_PREFIX = "feature.slurm.converged.hpc/"
GRES_ANNOTATION = "slurm.converged.hpc/gres"
_GRES_ITEM = re.compile(r"^(?P<name>[a-z][a-z0-9_]*)(:(?P<type>[A-Za-z0-9_.-]+))?:(?P<count>[0-9]+)$")


def _plain(value):
    return value if isinstance(value, dict) else {}


def parse_gres(value):
    """C(gpu:a100:2,nvme:1) as [{name, type, count}]; ValueError naming the part Slurm would not take."""
    out = []
    for item in str(value).split(","):
        match = _GRES_ITEM.match(item.strip())
        if not match or int(match.group("count")) < 1:
            raise ValueError("%r is not a GRES of the form name[:type]:count (as gpu:a100:4), count at least 1"
                             % item.strip())
        name = match.group("name")
        if any(g["name"] == name and g["type"] == (match.group("type") or "") for g in out):
            raise ValueError("%s is declared twice" % item.strip())
        out.append({"name": name, "type": match.group("type") or "", "count": int(match.group("count"))})
    return out


def gres_device_files(gres, devices=None, autodetect=""):
    """The device files a node's GRES needs present (C(gres): a GRES string or parse_gres' list;
    C(devices): converged_gres_devices, each GRES name's device file prefix; a name without one needs no
    file): none when slurmd finds the devices itself (C(autodetect): converged_gres_autodetect). What
    slurm_compute checks on a node before slurmd starts, and what join at boot's first boot checks."""
    if autodetect:
        return []
    items = (parse_gres(gres) if str(gres).strip() else []) if isinstance(gres, str) else list(gres or [])
    prefixes = devices if isinstance(devices, dict) else {}
    return ["%s%d" % (prefixes[i["name"]], n) for i in items if i["name"] in prefixes for n in range(i["count"])]


def gres_types(gres_strings):
    """The GRES names (GresTypes) of every valid GRES string given, sorted; the invalid ones are skipped."""
    names = set()
    for value in gres_strings or ():
        if value:
            try:
                names.update(g["name"] for g in parse_gres(value))
            except ValueError:
                continue
    return sorted(names)


_HOSTLIST_RANGE = re.compile(r"^(\d+)(-(\d+))?$")
HOSTLIST_MAX = 65536


def expand_hostlist(value):
    """A Slurm hostlist (gpu-[01-16,20],gpu-spare) as the names it stands for, in order; a list of such
    expressions is taken too. ValueError naming the part Slurm would not take."""
    parts = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for part in parts:
        text, depth, start = str(part).strip(), 0, 0
        pieces = []
        for i, char in enumerate(text):  # commas inside brackets are ranges, outside they separate names
            depth += {"[": 1, "]": -1}.get(char, 0)
            if depth < 0 or depth > 1:
                raise ValueError("%r: brackets do not match" % text)
            if char == "," and depth == 0:
                pieces.append(text[start:i])
                start = i + 1
        if depth:
            raise ValueError("%r: brackets do not match" % text)
        pieces.append(text[start:])
        for piece in pieces:
            out.extend(_expand_one(piece.strip(), text))
            if len(out) > HOSTLIST_MAX:
                raise ValueError("%r stands for more than %d names" % (text, HOSTLIST_MAX))
    return out


def _expand_one(piece, whole):
    """The names one hostlist piece (no comma outside its brackets) stands for: its first bracket group
    expanded, the rest in turn."""
    if not piece:
        raise ValueError("%r: an empty name" % whole)
    if "[" not in piece:
        if not _SLURM_NAME.match(piece):
            raise ValueError("%r: %r is not a valid Slurm node name" % (whole, piece))
        return [piece]
    head, rest = piece.split("[", 1)
    inside, tail = rest.split("]", 1)
    names = []
    for item in inside.split(","):
        match = _HOSTLIST_RANGE.match(item.strip())
        if not match:
            raise ValueError("%r: %r is not a number or a range of numbers" % (whole, item.strip()))
        low, high = match.group(1), match.group(3) or match.group(1)
        if int(high) < int(low):
            raise ValueError("%r: the range %s runs backwards" % (whole, item.strip()))
        if int(high) - int(low) >= HOSTLIST_MAX:
            raise ValueError("%r stands for more than %d names" % (whole, HOSTLIST_MAX))
        width = len(low) if low.startswith("0") and len(low) > 1 else 0
        for number in range(int(low), int(high) + 1):
            names.extend(_expand_one(head + str(number).zfill(width) + tail, whole))
            if len(names) > HOSTLIST_MAX:
                raise ValueError("%r stands for more than %d names" % (whole, HOSTLIST_MAX))
    return names


def _gres_lines(node, value, devices, autodetect):
    lines = []
    for item in parse_gres(value):
        line = "NodeName=%s Name=%s" % (node, item["name"])
        if item["type"]:
            line += " Type=%s" % item["type"]
        prefix = (devices or {}).get(item["name"])
        if prefix and not autodetect:
            count = item["count"]
            line += " File=%s%s" % (prefix, "0" if count == 1 else "[0-%d]" % (count - 1))
        elif not prefix:
            line += " Count=%d" % item["count"]
        else:
            continue
        lines.append(line)
    return lines


def gres_conf(hostnames, hostvars, devices=None, autodetect="", node_types=None):
    """gres.conf lines for the compute hosts given: per GRES of a host, its device files when the name has a
    device prefix in C(devices) (gpu -> /dev/nvidia: File=/dev/nvidia[0-3]), else its count; with
    C(autodetect) (nvml) the devices are found by slurmd and only the line for it is written. Then, ahead,
    the names a compute node type's C(gres_nodes) stands for (C(node_types)) that no host given has, with
    the node type's GRES: a node that joins at its first boot finds its line there. By node name: a host
    that comes or goes with the node type's GRES leaves the file as it was."""
    lines = {}
    for name in sorted(set(hostnames or ())):
        hv = hostvars[name]
        value = hv.get("converged_slurm_gres") or ""
        node = hv.get("converged_slurm_node_name") or name.split(".")[0]
        lines[node] = _gres_lines(node, value, devices, autodetect) if value else []
    for dummy, spec in sorted((node_types or {}).items()):
        spec = _plain(spec)
        if spec.get("role") != "compute" or not spec.get("gres") or not spec.get("gres_nodes"):
            continue
        for node in expand_hostlist(spec["gres_nodes"]):
            if node not in lines:
                lines[node] = _gres_lines(node, spec["gres"], devices, autodetect)
    return (["AutoDetect=%s" % autodetect] if autodetect else []) + [line for node in sorted(lines) for line in lines[node]]


def check_contract(node_types, partitions):
    """Sentences naming every inconsistency of the contract itself."""
    errors = []
    if not isinstance(node_types, dict) or not node_types:
        return ["converged_node_types is empty: the contract must name at least the controller node type"]
    defined = [p.get("name") for p in partitions or []]
    for name in defined:
        if not isinstance(name, str) or not _SLURM_NAME.match(name):
            errors.append("converged_partitions: %r is not a valid Slurm partition name" % (name,))
    dupes = sorted({n for n in defined if defined.count(n) > 1})
    if dupes:
        errors.append("converged_partitions defines %s more than once" % ", ".join(dupes))
    defaults = [p.get("name") for p in partitions or [] if p.get("default")]
    if len(defaults) > 1:
        errors.append("more than one default partition: %s" % ", ".join(defaults))
    used, nodesets, ahead = set(), {}, {}
    for node_type, spec in sorted(node_types.items()):
        spec = _plain(spec)
        role = spec.get("role")
        if role not in ROLES:
            errors.append("node type %s: role %r is not one of %s" % (node_type, role, ", ".join(ROLES)))
            continue
        if not _SLURM_NAME.match(node_type):
            errors.append("node type %r is not a valid Slurm feature name" % node_type)
        if role != "compute":
            if spec.get("nodeset") or spec.get("partitions") or spec.get("gres") or spec.get("gres_nodes"):
                errors.append("node type %s (role %s) names a nodeset, partitions, gres or gres_nodes: only compute node types "
                              "become Slurm nodes" % (node_type, role))
            continue
        if spec.get("gres"):
            try:
                parse_gres(spec["gres"])
            except ValueError as exc:
                errors.append("node type %s: gres %s" % (node_type, exc))
        if spec.get("gres_nodes"):
            if not spec.get("gres"):
                errors.append("node type %s names gres_nodes but declares no gres: gres_nodes are the names its "
                              "hosts register with, for their GRES lines in gres.conf ahead" % node_type)
            try:
                for name in expand_hostlist(spec["gres_nodes"]):
                    if name in ahead:
                        errors.append("node %s is in the gres_nodes of node types %s and %s: give it to one"
                                      % (name, ahead[name], node_type))
                    ahead.setdefault(name, node_type)
            except ValueError as exc:
                errors.append("node type %s: gres_nodes %s" % (node_type, exc))
        nodeset = spec.get("nodeset")
        parts = spec.get("partitions") or []
        if not nodeset:
            errors.append("node type %s (role compute) maps to no Slurm nodeset: set "
                          "converged_node_types.%s.nodeset" % (node_type, node_type))
        elif not _SLURM_NAME.match(str(nodeset)):
            errors.append("node type %s: nodeset %r is not a valid Slurm name" % (node_type, nodeset))
        elif nodeset in nodesets:
            errors.append("nodeset %s is fed by two node types (%s and %s): give each its own"
                          % (nodeset, nodesets[nodeset], node_type))
        else:
            nodesets[nodeset] = node_type
        if not parts:
            errors.append("node type %s (role compute) is in no partition: set converged_node_types.%s.partitions"
                          % (node_type, node_type))
        missing = [p for p in parts if p not in defined]
        if missing:
            errors.append("node type %s names partition(s) %s that converged_partitions does not define "
                          "(defined: %s)" % (node_type, ", ".join(missing), ", ".join(defined) or "none"))
        used.update(parts)
    if not any(_plain(s).get("role") == "controller" for s in node_types.values()):
        errors.append("no node type has role controller: the contract needs one")
    empty = [p for p in defined if p not in used]
    if empty:
        errors.append("partition(s) %s hold no nodeset: no node type names them in its partitions"
                      % ", ".join(empty))
    return errors


def nodesets(node_types):
    """NodeSet lines: each compute node type's nodeset, selecting nodes by the node type as Feature."""
    out = []
    for node_type, spec in sorted(node_types.items()):
        spec = _plain(spec)
        if spec.get("role") == "compute" and spec.get("nodeset"):
            out.append({"name": spec["nodeset"], "feature": node_type, "node_type": node_type,
                        "partitions": list(spec.get("partitions") or [])})
    return out


def _node_type(name, hv, groups, node_types, capi_var):
    explicit = hv.get("converged_node_type")
    if explicit:
        return explicit
    capi = hv.get(capi_var)
    if isinstance(capi, dict) and capi.get("node_type"):
        return capi["node_type"]
    for node_type in sorted(node_types):
        if name in (groups.get(node_type) or ()):
            return node_type
    return None


def _cluster_of(hostvars, name, capi_var):
    capi = hostvars[name].get(capi_var)
    return capi.get("cluster") if isinstance(capi, dict) else None


def label_features(labels, prefix):
    """Slurm features from Machine labels: C(<prefix>gpu: "true") gives C(gpu), in label order."""
    if not prefix or not isinstance(labels, dict):
        return []
    return [key[len(prefix):] for key in sorted(labels) if key.startswith(prefix) and len(key) > len(prefix)
            and str(labels[key]).lower() not in ("false", "no", "0")]


def contract(hostvars, groups, node_types, partitions, cluster="", play_hosts=None, capi_var="capi",
             feature_label_prefix=FEATURE_LABEL_PREFIX, accounting=False, accounting_node_type="",
             gres_annotation=GRES_ANNOTATION):
    """Apply the contract to every inventory host; see DOCUMENTATION."""
    if not isinstance(groups, dict):
        raise AnsibleFilterError("contract: groups must be a dict")
    node_types = node_types or {}
    errors = check_contract(node_types, partitions)
    if cluster:
        clusters = [cluster]
    else:
        clusters = sorted({c for c in (_cluster_of(hostvars, h, capi_var) for h in play_hosts or ()) if c})
        if len(clusters) > 1:
            errors.append("the hosts of this run belong to %d Cluster API clusters (%s): converge one at a time, "
                          "with --limit capi_cluster_<name> or -e converged_cluster=<name>"
                          % (len(clusters), ", ".join(clusters)))
    result = {"errors": errors, "hosts": [], "nodesets": nodesets(node_types), "ignored": [], "clusters": clusters,
              "slurmdbd": "", "gres_types": []}
    declared = [_plain(spec).get("gres") for spec in node_types.values()
                if _plain(spec).get("role") == "compute"]
    names = {}
    for name in groups.get("all") or ():
        hv = hostvars[name]
        capi = hv.get(capi_var)
        capi = capi if isinstance(capi, dict) else {}
        if clusters and capi.get("cluster") and capi.get("cluster") not in clusters:
            continue
        node_type = _node_type(name, hv, groups, node_types, capi_var)
        if node_type is None:
            continue
        spec = _plain(node_types.get(node_type))
        if not spec:
            result["ignored"].append("%s (node type %s)" % (name, node_type))
            continue
        role = spec.get("role")
        node_name = hv.get("converged_slurm_node_name") or capi.get("hostname") or name.split(".")[0]
        if not _SLURM_NAME.match(str(node_name)):
            errors.append("host %s: Slurm node name %r is not valid" % (name, node_name))
        if str(node_name) in names:
            errors.append("hosts %s and %s would both be Slurm node %s" % (names[str(node_name)], name, node_name))
        names[str(node_name)] = name
        leaving = bool(capi.get("deleting"))
        # a leaving host is in no group that converges: only scale-down and reconcile touch it
        host_groups = [LEAVING, "%s_%s" % (LEAVING, role)] if leaving else [GROUP % role, ALL]
        host_vars = {"converged_node_type": node_type, "converged_role": role,
                     "converged_slurm_node_name": str(node_name)}
        if role == "compute":
            host_vars["converged_slurm_nodeset"] = spec.get("nodeset")
            features = [node_type] + label_features(capi.get("labels"), feature_label_prefix)
            host_vars["converged_slurm_features"] = list(dict.fromkeys(features))
            annotations = capi.get("annotations") if isinstance(capi.get("annotations"), dict) else {}
            gres = str(annotations.get(gres_annotation) or spec.get("gres") or "").strip()
            if gres:
                try:
                    parse_gres(gres)
                    declared.append(gres)
                except ValueError as exc:
                    where = "annotation %s" % gres_annotation if annotations.get(gres_annotation) else "node type gres"
                    errors.append("host %s: %s: %s" % (name, where, exc))
            host_vars["converged_slurm_gres"] = gres
        result["hosts"].append({"name": name, "groups": host_groups, "vars": host_vars})
    # the groups list their hosts by Slurm node name, whatever order the inventory gave: the first controller
    # (slurm.conf's primary, keepalived's first) is the one whose name sorts first, never the one whose Cluster
    # API Machine name (random letters at its end) happens to
    result["hosts"].sort(key=lambda h: (h["vars"]["converged_slurm_node_name"], h["name"]))
    if accounting:
        _choose_slurmdbd(result, node_types, accounting_node_type)
    result["gres_types"] = gres_types(declared)
    return result


def _of_role(node_types, role):
    return [t for t in sorted(node_types) if _plain(node_types[t]).get("role") == role]


def _choose_slurmdbd(result, node_types, wanted):
    """Put the first live host of the accounting node type in SLURMDBD, or say why none can be."""
    live = {}
    for host in result["hosts"]:
        if LEAVING not in host["groups"]:
            live.setdefault(host["vars"]["converged_node_type"], []).append(host)
    if wanted:
        if wanted not in node_types:
            result["errors"].append("converged_accounting_node_type %r is not a node type of the contract (%s)"
                                    % (wanted, ", ".join(sorted(node_types))))
            return
        candidates = [wanted]
    else:
        candidates = [t for t in _of_role(node_types, "accounting") if live.get(t)] \
            or _of_role(node_types, "controller")
    hosts = sorted((h for t in candidates for h in live.get(t, ())), key=lambda h: h["name"])
    if not hosts:
        result["errors"].append("accounting is on (converged_accounting) but no host can run slurmdbd: node type %s "
                                "has no Machine that is not being deleted" % " or ".join(candidates))
        return
    hosts[0]["groups"].append(SLURMDBD)
    result["slurmdbd"] = hosts[0]["name"]


def placeholders(node_types, hostvars=None, hosts=None, count=0, cpus=1024, memory_mib=4194304):
    """Per nodeset, C(count) FUTURE nodes (slurm.conf NodeName settings) that stand for the machines its
    MachineDeployment may bring: never scheduled, never shown by sinfo, they only let a partition take
    jobs larger than the nodes it has now. Their GRES is the most of each GRES the node type or its
    hosts (C(hosts), with C(converged_slurm_nodeset) and C(converged_slurm_gres)) declare."""
    count = int(count or 0)
    if count <= 0:
        return []
    out = []
    for ns in nodesets(node_types or {}):
        most = {}
        declared = [_plain((node_types or {}).get(ns["node_type"])).get("gres")]
        for name in hosts or ():
            hv = (hostvars or {})[name]
            if hv.get("converged_slurm_nodeset") == ns["name"]:
                declared.append(hv.get("converged_slurm_gres"))
        for value in declared:
            if not value:
                continue
            try:
                items = parse_gres(value)
            except ValueError:
                continue  # the contract names it and stops the run
            for item in items:
                key = (item["name"], item["type"])
                most[key] = max(most.get(key, 0), item["count"])
        for name, kind in list(most):
            if not kind and any(n == name and k for n, k in most):
                del most[(name, kind)]  # a typed GRES answers an untyped request too
        gres = ",".join("%s%s:%d" % (name, ":" + kind if kind else "", most[(name, kind)])
                        for name, kind in sorted(most))
        out.append({"NodeName": "%s-future-[1-%d]" % (ns["name"], count) if count > 1 else "%s-future-1" % ns["name"],
                    "State": "FUTURE", "Feature": ns["feature"], "Sockets": 1, "CoresPerSocket": int(cpus),
                    "ThreadsPerCore": 1, "RealMemory": int(memory_mib),
                    "Gres": gres})
    return out


def partitions_with_nodes(node_types, partitions):
    """converged_partitions, each with the nodesets the contract puts in it."""
    sets = nodesets(node_types or {})
    return [dict(p, nodesets=[s["name"] for s in sets if p.get("name") in s["partitions"]])
            for p in partitions or []]


class FilterModule(object):
    def filters(self):
        return {"contract": contract, "contract_nodesets": nodesets,
                "contract_partitions": partitions_with_nodes, "contract_placeholders": placeholders,
                "gres_parse": parse_gres, "gres_device_files": gres_device_files,
                "gres_types": gres_types, "gres_conf": gres_conf, "hostlist_expand": expand_hostlist}
