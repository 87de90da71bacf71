# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The digest of a converge's inputs: the inventory as Ansible sees it and the collection's own files."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: converge_digest
short_description: A digest of everything a converge of the whole inventory is computed from
version_added: 0.1.0
author: converged.hpc contributors (@converged-hpc)
description:
  - One SHA-256 over the variables of every host of the inventory (inventory, group and host variables, extra
    variables, facts set by the contract), the inventory's groups, the Ansible version, and the files of this
    collection (roles, playbooks, plugins, meta) and of the playbook's directory.
  - The variables are taken before templating, so the digest changes when a variable's definition does.
  - Left out, because a run does not depend on them or changes them itself - gathered facts, the
    run's own options (check mode, tags, forks, verbosity, C(converged_skip_unchanged)), what AWX and
    Event-Driven Ansible add to every job (C(awx_*), C(tower_*), C(ansible_eda)), C(omit), groups named C(converged_*) other
    than the contract's (a run adds them), and Cluster API deletion hooks in the Machines' annotations (site.yml
    puts ours on; the fast path checks it is there instead).
  - With O(secret_name), the version of that Secret (C(metadata.uid) and C(metadata.resourceVersion)) is part of
    the digest - the munge key Secret with C(munge_key_source=secret), which lives outside the inventory. One
    GET through the Cluster API inventory's client; the Secret's data is never kept or shown.
  - Used by C(site.yml)'s unchanged-host fast path with M(converged.hpc.converge_state).
options:
  _terms:
    description: Not used.
    required: false
  secret_name:
    description: A Secret in the management cluster whose version is an input; empty for none.
    type: str
    default: ""
  secret_namespace:
    description: Its namespace.
    type: str
    default: default
  kubeconfig:
    description: The kubeconfig to reach it (empty - as kubernetes.core finds one, C(K8S_AUTH_*) included).
    type: str
    default: ""
  context:
    description: The kubeconfig context (empty - the current one).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: The digest of this run's inputs, once
  ansible.builtin.set_fact:
    _converged_state_digest: "{{ lookup('converged.hpc.converge_digest') }}"
  run_once: true
"""

RETURN = r"""
_raw:
  description: One hexadecimal SHA-256.
  type: list
  elements: str
"""

import hashlib
import json
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

try:
    from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (
        CapiApiError,
        read_secret,
    )
except ImportError:  # pragma: no cover - the module_utils ship with this plugin
    read_secret = None

# the run's options and Ansible's own bookkeeping, not inputs of the converge
_RUN_KEYS = frozenset((
    "omit", "groups", "hostvars", "vars", "environment", "play_hosts", "role_names", "ansible_facts",
    "ansible_check_mode", "ansible_diff_mode", "ansible_forks", "ansible_verbosity", "ansible_limit",
    "ansible_run_tags", "ansible_skip_tags", "ansible_inventory_sources", "ansible_config_file",
    "ansible_playbook_python", "ansible_local", "ansible_search_path", "ansible_collection_name",
    "ansible_role_names", "ansible_dependent_role_names", "ansible_loop_var", "ansible_index_var",
    "inventory_file", "inventory_dir", "playbook_dir", "ansible_parent_role_names", "ansible_parent_role_paths",
    # the fast path's own switch: a run in full records the digest a default run compares with
    "converged_skip_unchanged",
    # an Event-Driven Ansible event, new in every job
    "ansible_eda",
))
# AWX's own extra variables (the job's id, user, template, webhook...): new in every job
_RUN_PREFIXES = ("ansible_play_", "awx_", "tower_")
# groups a run makes for itself (the contract's own groups follow from the inventory and stay in)
_RUN_GROUPS = ("converged_new", "converged_repair", "converged_live_controller", "converged_unchanged",
               "converged_leaving", "converged_leaving_compute")
_HOOK_MARK = ".delete.hook.machine.cluster.x-k8s.io/"
_TREES = ("roles", "playbooks", "plugins", "meta")
_COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_cache = {}


def _files_digest(top, recursive=True):
    """SHA-256 over the relative names and contents of the files under top (no caches, no hidden files)."""
    digest = hashlib.sha256()
    if not os.path.isdir(top):
        return digest.hexdigest()
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith(".")) if recursive else []
        for name in sorted(files):
            if name.startswith(".") or name.endswith((".pyc", ".retry")):
                continue
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, top).encode() + b"\0")
            try:
                with open(path, "rb") as f:
                    digest.update(hashlib.sha256(f.read()).digest())
            except OSError:
                digest.update(b"unreadable")
    return digest.hexdigest()


def _collection_digest():
    if "collection" not in _cache:
        _cache["collection"] = [_files_digest(os.path.join(_COLLECTION, tree)) for tree in _TREES]
    return _cache["collection"]


def strip_hooks(annotations):
    """Machine annotations without Cluster API deletion hooks (a converge adds ours)."""
    return {k: v for k, v in annotations.items() if _HOOK_MARK not in str(k)}


def host_inputs(raw):
    """The variables of one host that a converge depends on, from HostVars.raw_get()."""
    facts = raw.get("ansible_facts") or {}
    fact_keys = {"ansible_" + str(k) for k in facts} if hasattr(facts, "keys") else set()
    out = {}
    for key, value in raw.items():
        if key in _RUN_KEYS or key.startswith(_RUN_PREFIXES) or key in fact_keys:
            continue
        if isinstance(value, dict) and isinstance(value.get("annotations"), dict):
            value = dict(value, annotations=strip_hooks(value["annotations"]))
        out[key] = value
    return out


def inputs_digest(hosts, groups, version, trees):
    """SHA-256 over {host: inputs}, the groups (less a run's own), the Ansible version and the file digests."""
    doc = {
        "hosts": hosts,
        "groups": {g: sorted(members) for g, members in groups.items() if g not in _RUN_GROUPS},
        "ansible": version,
        "trees": trees,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def secret_version(name, namespace, kubeconfig="", context=""):
    """'uid/resourceVersion' of a Secret, 'absent' when it does not exist; its data is dropped at once."""
    try:
        secret = read_secret(name, namespace, kubeconfig, context)
    except CapiApiError as exc:
        raise AnsibleLookupError("cannot read Secret %s/%s: %s" % (namespace, name, exc))
    if secret is None:
        return "absent"
    meta = secret.get("metadata") or {}
    return "%s/%s" % (meta.get("uid"), meta.get("resourceVersion"))


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        variables = variables or {}
        hostvars = variables.get("hostvars")
        groups = variables.get("groups") or {}
        if hostvars is None or not hasattr(hostvars, "raw_get"):
            raise ValueError("converge_digest needs the play's hostvars")
        hosts = {}
        for name in sorted(groups.get("all", [])):
            hosts[name] = host_inputs(hostvars.raw_get(name))
        version = (variables.get("ansible_version") or {}).get("full")
        trees = _collection_digest() + [_files_digest(str(variables.get("playbook_dir") or ""), recursive=False)]
        name = self.get_option("secret_name")
        if name:
            namespace = self.get_option("secret_namespace")
            trees.append("secret %s/%s %s" % (namespace, name, secret_version(
                name, namespace, self.get_option("kubeconfig"), self.get_option("context"))))
        return [inputs_digest(hosts, groups, version, trees)]
