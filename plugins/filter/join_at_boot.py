# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which MachineDeployments can have their new Machines join Slurm at first boot, and what they declare."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: join_at_boot_plan
short_description: Check the MachineDeployments whose new Machines are to join Slurm at their first boot
version_added: 0.3.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Input is the cluster's MachineDeployments (their API objects). Returns C(errors), every reason a requested
    MachineDeployment cannot join at boot, each naming it, and C(deployments), one entry a requested
    MachineDeployment - C(name), C(namespace), C(node_type), C(features) (the node type, then the template's
    feature labels, as the contract gives its Machines), C(secret) (the bootstrap data Secret's name,
    C(<name>-join)), C(named) (whether the template's C(bootstrap.dataSecretName) already names it), C(gres)
    (the GRES its nodes register with, empty for none) and C(devices) (the device files the boot checks before
    slurmd starts).
  - A MachineDeployment joins at boot only when nothing a converge guarantees before a node takes jobs is
    left out. Its template's node-type must be a node type of role compute; the template must carry our
    deletion hook (Cluster API copies template annotations to each new Machine, so the hook is on the Machine
    before its node can take a job). GRES (the template's annotation, else the node type's) need a node's line
    in the controllers' gres.conf before slurmd fetches it; they join at boot when the node type names its hosts
    ahead (C(gres_nodes), its GRES as the template's) or when slurmd finds every device itself (C(gres_autodetect)
    and a device prefix for each GRES name); otherwise they join through C(scale_up.yml). Identities from a
    directory are configured at boot by the bootstrap data itself (SSSD before slurmd).
  - A Secret of that name that converged.hpc did not write is never overwritten.
positional: requested, node_types, hook_key
options:
  _input:
    description: The cluster's MachineDeployments (C(kubernetes.core.k8s_info) resources).
    type: list
    elements: dict
    required: true
  requested:
    description: Names of the MachineDeployments to join at boot (C(converged_join_at_boot)).
    type: list
    elements: raw
    required: true
  node_types:
    description: C(converged_node_types).
    type: dict
    required: true
  hook_key:
    description: Our deletion hook's annotation key.
    type: str
    required: true
  secrets:
    description: The Secrets already there, by name (C(kubernetes.core.k8s_info) resources).
    type: list
    elements: dict
    default: []
  node_type_label:
    description: The label naming a Machine's node type.
    type: str
    default: node-type
  feature_label_prefix:
    description: The prefix of the labels that give a node a Slurm feature.
    type: str
    default: feature.slurm.converged.hpc/
  gres_annotation:
    description: The annotation that declares a Machine's GRES.
    type: str
    default: slurm.converged.hpc/gres
  gres_devices:
    description: C(converged_gres_devices), the device file prefix of each GRES name.
    type: dict
    default: {}
  gres_autodetect:
    description: C(converged_gres_autodetect) (nvml...), empty when gres.conf names the devices.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Check the MachineDeployments to join at boot
  ansible.builtin.set_fact:
    join_plan: >-
      {{ deployments.resources | converged.hpc.join_at_boot_plan(['hpc-compute'], converged_node_types,
         _converged_hook_key, secrets=secrets.resources) }}
"""

RETURN = r"""
_value:
  description: C(errors) (a list of messages) and C(deployments) (a list of dicts, see the description).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.converged.hpc.plugins.filter.contract import FEATURE_LABEL_PREFIX, GRES_ANNOTATION, parse_gres
from ansible_collections.converged.hpc.plugins.filter.contract import gres_device_files, label_features

MANAGED_BY = "app.kubernetes.io/managed-by"
OURS = "converged.hpc"


def _get(obj, *path):
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj if obj is not None else {}


def join_at_boot_plan(deployments, requested, node_types, hook_key, secrets=None,
                      node_type_label="node-type", feature_label_prefix=FEATURE_LABEL_PREFIX,
                      gres_annotation=GRES_ANNOTATION, gres_devices=None, gres_autodetect=""):
    """See DOCUMENTATION."""
    if not isinstance(deployments, list):
        raise AnsibleFilterError("join_at_boot_plan: the MachineDeployments must be a list")
    if not isinstance(requested, list):
        raise AnsibleFilterError("converged_join_at_boot must be a list of MachineDeployment names, not %r"
                                 % (requested,))
    node_types = node_types if isinstance(node_types, dict) else {}
    by_name = dict((_get(md, "metadata").get("name"), md) for md in deployments)
    existing = dict((_get(s, "metadata").get("name"), s) for s in secrets or ())
    plan = {"errors": [], "deployments": []}
    for name in requested:
        if not isinstance(name, str) or not name:
            plan["errors"].append("converged_join_at_boot: %r is not a MachineDeployment name" % (name,))
            continue
        md = by_name.get(name)
        if md is None:
            plan["errors"].append("converged_join_at_boot names MachineDeployment %s, which the cluster does not have"
                                  " (it has: %s)" % (name, ", ".join(sorted(n for n in by_name if n)) or "none"))
            continue
        what = "MachineDeployment %s/%s" % (_get(md, "metadata").get("namespace", ""), name)
        labels = _get(md, "spec", "template", "metadata", "labels")
        annotations = _get(md, "spec", "template", "metadata", "annotations")
        node_type = labels.get(node_type_label)
        spec = node_types.get(node_type) if node_type else None
        spec = spec if isinstance(spec, dict) else {}
        if spec.get("role") != "compute":
            plan["errors"].append("%s: its Machines are node type %s, which feeds no Slurm nodeset"
                                  % (what, node_type or "(no %s label in its template)" % node_type_label))
            continue
        errors = []
        if hook_key not in annotations:
            errors.append("its template does not carry our deletion hook (annotation %s): a Machine could take jobs "
                          "before scale_up.yml holds it, and be deleted without a drain" % hook_key)
        gres = str(annotations.get(gres_annotation) or spec.get("gres") or "").strip()
        devices = []
        if gres:
            try:
                items = parse_gres(gres)
            except ValueError as exc:
                items = []
                errors.append("its GRES %s: %s" % (gres, exc))
            prefixes = gres_devices if isinstance(gres_devices, dict) else {}
            found = bool(gres_autodetect) and all(i["name"] in prefixes for i in items)
            ahead = bool(spec.get("gres_nodes")) and gres == str(spec.get("gres") or "").strip()
            if items and not (found or ahead):
                errors.append(
                    "its nodes declare GRES (%s): a node's line must be in the controllers' gres.conf before it registers; "
                    "name the hosts ahead (converged_node_types.%s.gres_nodes, the Slurm hostlist of the names they register "
                    "with: their BareMetalHosts' hostnames%s), or let slurmd find the devices (converged_gres_autodetect), "
                    "or let them join through scale_up.yml"
                    % (gres, node_type, ", with the node type's gres, not the template's %s" % gres
                       if spec.get("gres_nodes") else ""))
            devices = gres_device_files(items, prefixes, gres_autodetect)
        secret = "%s-join" % name
        there = existing.get(secret)
        if there is not None and _get(there, "metadata", "labels").get(MANAGED_BY) != OURS:
            errors.append("Secret %s exists and converged.hpc did not write it (no label %s=%s): it is not overwritten"
                          % (secret, MANAGED_BY, OURS))
        plan["errors"].extend("%s: %s" % (what, e) for e in errors)
        if errors:
            continue
        plan["deployments"].append({
            "name": name, "namespace": _get(md, "metadata").get("namespace", ""), "node_type": node_type,
            "features": list(dict.fromkeys([node_type] + label_features(labels, feature_label_prefix))),
            "secret": secret,
            "named": _get(md, "spec", "template", "spec", "bootstrap").get("dataSecretName") == secret,
            "gres": gres, "devices": devices})
    return plan


def _fstab_field(value):
    return str(value).replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011").replace("\n", "\\012")


def join_at_boot_fstab(mounts, server, default_opts=("rw", "hard", "_netdev")):
    """The fstab line of each NFS mount ({src, path, opts}) as ansible.posix.mount writes it: [{path, line}]."""
    if not isinstance(mounts, list):
        raise AnsibleFilterError("join_at_boot_fstab: the mounts must be a list, not %r" % (mounts,))
    out = []
    for mount in mounts:
        if not isinstance(mount, dict) or not mount.get("src") or not mount.get("path"):
            raise AnsibleFilterError("join_at_boot_fstab: %r is not a mount with src and path" % (mount,))
        opts = mount.get("opts") or list(default_opts)
        fields = ["%s:%s" % (server, mount["src"]), mount["path"], "nfs",
                  ",".join(opts) if isinstance(opts, list) else opts, "0", "0"]
        out.append({"path": mount["path"], "line": " ".join(_fstab_field(f) for f in fields)})
    return out


class FilterModule(object):
    def filters(self):
        return {"join_at_boot_plan": join_at_boot_plan, "join_at_boot_fstab": join_at_boot_fstab}
