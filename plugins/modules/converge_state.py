#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: converge_state
short_description: Record what a converge left on a host, and tell whether the host still matches it
version_added: 0.1.0
author: converged.hpc contributors (@converged-hpc)
description:
  - The host side of the unchanged-host fast path of C(site.yml) (docs/slurm.md, "A second converge").
  - A host's B(state) is its fingerprint - the content, mode, owner and group of every file under O(trees),
    the mode, owner and group of each of O(stat_only), the load, active and unit-file states of O(units), and
    the network file systems mounted - with the O(digest) of the converge's inputs.
  - C(present) writes it to O(stamp) (root only, written whole or not at all) after a converge that
    succeeded. C(check) compares the host with the stamp and returns RV(current) and, when it differs,
    RV(reasons), naming each difference. C(absent) removes the stamp, so the next run converges in full.
  - The stamp holds checksums and states, never a file's content.
options:
  state:
    description: Check the host against the stamp, write the stamp, or remove it.
    type: str
    choices: [check, present, absent]
    default: check
  digest:
    description: The digest of the converge's inputs (M(converged.hpc.converge_state) does not compute it).
    type: str
    default: ""
  trees:
    description: Files and directories whose every file is fingerprinted (content, mode, owner, group; a link by its target).
    type: list
    elements: path
    default: []
  stat_only:
    description: Paths fingerprinted by their type, mode, owner and group only (directories whose content is data).
    type: list
    elements: path
    default: []
  units:
    description: systemd units whose load, active and unit-file states are fingerprinted.
    type: list
    elements: str
    default: []
  held:
    description:
      - With C(check), whether the host's Machine holds the deletion hook a converge puts on it (or needs none).
        False makes the host differ, so the converge puts the hook back.
    type: bool
    default: true
  slurm_nodes:
    description:
      - With C(check), Slurm node names, each with the C(MemSpecLimit) it declares (MiB, 0 for none). One
        C(scontrol show node --oneliner) reads their records from slurmctld. A node without a record, or whose
        record shows another C(MemSpecLimit), is a difference (state inside slurmctld, not in any file).
      - Slurm 22.05 does not keep a dynamic node's C(MemSpecLimit) across a slurmctld restart or a takeover by
        the backup, and C(scontrol update) cannot set it. Only the node registering again brings it back.
      - Give it on one host that has C(scontrol) (a controller).
    type: dict
    default: {}
  stamp:
    description: Where the stamp is kept.
    type: path
    default: /var/lib/converged-hpc/converge-state.json
notes:
  - A missing path is fingerprinted as missing, so a file the converge would create counts as a difference.
attributes:
  check_mode:
    support: full
    description: C(check) never changes anything; C(present) and C(absent) report whether they would write or remove the stamp.
  diff_mode:
    support: none
    description: No diff is shown; the stamp holds checksums only.
"""

EXAMPLES = r"""
- name: Is the host as the last converge left it?
  converged.hpc.converge_state:
    digest: "{{ _converged_state_digest }}"
    trees: [/etc/slurm, /etc/munge]
    units: [munge, slurmd]
  register: state

- name: Record the state after a converge that succeeded
  converged.hpc.converge_state:
    state: present
    digest: "{{ _converged_state_digest }}"
    trees: [/etc/slurm, /etc/munge]
    units: [munge, slurmd]
"""

RETURN = r"""
current:
  description: With C(check), whether a stamp exists with this digest and the host matches it.
  returned: always
  type: bool
reasons:
  description:
    - With C(check), what differs, at most 20 entries (C(no stamp), C(inputs changed), a path, a unit, the mounts,
      a Slurm node's record).
  returned: always
  type: list
  elements: str
"""

import hashlib
import json
import os
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import parse_nodes

FORMAT = 1
NETWORK_FS = ("nfs", "nfs4", "fuse.", "ceph", "cifs", "lustre", "glusterfs", "beegfs", "gpfs")
MAX_REASONS = 20


def _entry(path, st, content=True):
    """One path's fingerprint: its type, mode, owner, group and, with content, a link's target or a digest of a file."""
    head = "%o:%d:%d" % (st.st_mode, st.st_uid, st.st_gid)
    if not content:
        return "stat:%s" % head
    if stat.S_ISLNK(st.st_mode):
        return "link:%s:%s" % (head, os.readlink(path))
    if stat.S_ISREG(st.st_mode):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return "file:%s:%s" % (head, digest.hexdigest())
    if stat.S_ISDIR(st.st_mode):
        return "dir:%s" % head
    return "other:%s" % head


def _lstat(path):
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def fingerprint_paths(trees, stat_only):
    """{path: entry} for every path under trees (recursively, links not followed) and each of stat_only."""
    out = {}
    for top in trees:
        st = _lstat(top)
        if st is None:
            out[top] = "missing"
            continue
        out[top] = _entry(top, st)
        if not stat.S_ISDIR(st.st_mode):
            continue
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                path = os.path.join(root, name)
                st = _lstat(path)
                if st is not None:
                    out[path] = _entry(path, st)
    for path in stat_only:
        st = _lstat(path)
        out[path] = "missing" if st is None else _entry(path, st, content=False)
    return out


def unit_states(module, units):
    """{unit: 'LoadState/ActiveState/UnitFileState'} from one systemctl show."""
    if not units:
        return {}
    systemctl = module.get_bin_path("systemctl", required=True)
    rc, out, err = module.run_command([systemctl, "show", "--property=Id,LoadState,ActiveState,UnitFileState", "--"]
                                      + list(units))
    if rc != 0:
        module.fail_json(msg="systemctl show failed: %s" % (err.strip() or out.strip()))
    states, current = [], {}
    for line in out.splitlines() + [""]:
        if not line.strip():
            if current:
                states.append(current)
            current = {}
            continue
        key, _sep, value = line.partition("=")
        current[key] = value
    if len(states) != len(units):
        module.fail_json(msg="systemctl show gave %d records for %d units (%s)" % (len(states), len(units), ", ".join(units)))
    return {unit: "%s/%s/%s" % (s.get("LoadState"), s.get("ActiveState"), s.get("UnitFileState"))
            for unit, s in zip(units, states)}


def network_mounts(path="/proc/mounts"):
    """The mounted network file systems, 'source mountpoint fstype', sorted."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and fields[2].startswith(NETWORK_FS):
            out.append(" ".join(fields[:3]))
    return sorted(out)


def slurm_record_differences(module, declared):
    """What differs between the nodes' records in slurmctld and what they declare (MemSpecLimit), named."""
    if not declared:
        return []
    scontrol = module.get_bin_path("scontrol")
    if scontrol is None:
        return ["Slurm's node records could not be read: no scontrol on this host"]
    rc, out, err = module.run_command([scontrol, "show", "node", "--oneliner"])
    if rc != 0:
        return ["Slurm's node records could not be read: %s" % (err.strip() or out.strip() or "scontrol exit %d" % rc)]
    records = {record["NodeName"]: record for record in parse_nodes(out)}
    reasons = []
    for node in sorted(declared):
        if node not in records:
            reasons.append("Slurm has no record of node %s" % node)
            continue
        seen = records[node].get("MemSpecLimit", "0")
        if str(seen) != str(declared[node]):
            reasons.append("node %s's record has MemSpecLimit %s, it declares %s" % (node, seen, declared[node]))
    return reasons


def observe(module, params):
    return {
        "format": FORMAT,
        "digest": params["digest"],
        "paths": fingerprint_paths(params["trees"], params["stat_only"]),
        "units": unit_states(module, params["units"]),
        "mounts": network_mounts(),
    }


def differences(recorded, now):
    """What differs between a recorded state and the observed one, named."""
    if not recorded:
        return ["no stamp (the last converge did not finish on this host, or it never ran)"]
    if recorded.get("format") != FORMAT:
        return ["stamp format %s" % recorded.get("format")]
    if recorded.get("digest") != now["digest"]:
        return ["inputs changed (inventory, variables or the collection)"]
    reasons = []
    old, new = recorded.get("paths") or {}, now["paths"]
    for path in sorted(set(old) | set(new)):
        if old.get(path) != new.get(path):
            reasons.append("%s %s" % (path, "appeared" if path not in old else "is gone" if path not in new
                                      or new[path] == "missing" else "changed"))
    old, new = recorded.get("units") or {}, now["units"]
    for unit in sorted(set(old) | set(new)):
        if old.get(unit) != new.get(unit):
            reasons.append("unit %s is %s (was %s)" % (unit, new.get(unit, "not checked"), old.get(unit, "not checked")))
    if (recorded.get("mounts") or []) != now["mounts"]:
        reasons.append("network mounts changed: %s" % (", ".join(now["mounts"]) or "none mounted"))
    return reasons


def read_stamp(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_stamp(module, path, data):
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".converge-state.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, 0o600)
        module.atomic_move(tmp, path)
        os.chmod(path, 0o600)  # atomic_move gives a new file the umask's mode
    except Exception:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["check", "present", "absent"], default="check"),
            digest=dict(type="str", default=""),
            trees=dict(type="list", elements="path", default=[]),
            stat_only=dict(type="list", elements="path", default=[]),
            units=dict(type="list", elements="str", default=[]),
            held=dict(type="bool", default=True),
            slurm_nodes=dict(type="dict", default={}),
            stamp=dict(type="path", default="/var/lib/converged-hpc/converge-state.json"),
        ),
        required_if=[("state", "present", ["digest"]), ("state", "check", ["digest"])],
        supports_check_mode=True,
    )
    params = module.params
    bad = ["%s: %r" % (node, limit) for node, limit in params["slurm_nodes"].items()
           if not str(limit).isdigit()]
    if bad:
        module.fail_json(msg="slurm_nodes: a MemSpecLimit is a whole number of MiB (%s)" % ", ".join(bad))
    params["slurm_nodes"] = {node: int(limit) for node, limit in params["slurm_nodes"].items()}
    for name in ("trees", "stat_only"):
        bad = [p for p in params[name] if not os.path.isabs(p)]
        if bad:
            module.fail_json(msg="%s: %s is not an absolute path" % (name, ", ".join(bad)))
    stamp = params["stamp"]
    recorded = read_stamp(stamp)
    if params["state"] == "absent":
        exists = os.path.lexists(stamp)
        if exists and not module.check_mode:
            os.unlink(stamp)
        module.exit_json(changed=exists, current=False, reasons=[])
    now = observe(module, params)
    if params["state"] == "check":
        reasons = differences(recorded, now)
        reasons += slurm_record_differences(module, params["slurm_nodes"])
        if not params["held"]:
            reasons.insert(0, "the Machine lacks the deletion hook")
        module.exit_json(changed=False, current=not reasons, reasons=reasons[:MAX_REASONS])
    changed = recorded != now
    if changed and not module.check_mode:
        write_stamp(module, stamp, now)
    module.exit_json(changed=changed, current=True, reasons=[])


if __name__ == "__main__":
    main()
