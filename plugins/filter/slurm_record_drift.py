# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where Slurm's record of a dynamic node differs from what the node declares."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_record_drift
short_description: Where Slurm's record of a node differs from the node's declaration
version_added: 0.2.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Slurm keeps the declaration a dynamic node registered with for as long as its record exists, and
    ignores a changed C(slurmd --conf). This compares the record (C(scontrol show node --oneliner))
    with the declaration the node's options now carry.
  - Compared are C(RealMemory), C(MemSpecLimit) (absent is 0), C(Gres) (the record's socket affinity,
    C((S:0-1)), is left out; the order of several GRES does not matter; one declared without a type,
    C(gpu:2), is the record's C(gpu:a100:2) that autodetection typed) and C(CPUs) (the record's
    C(CPUTot)); a key missing from O(declared) is not compared.
positional: declared
options:
  _input:
    description: The node's line from C(scontrol show node --oneliner).
    type: str
    required: true
  declared:
    description: The declared values, by the keys above.
    type: dict
    required: true
"""

EXAMPLES = r"""
# ['MemSpecLimit 256 -> 512']
drift: "{{ scontrol_line | converged.hpc.slurm_record_drift({'RealMemory': 4000, 'MemSpecLimit': 512}) }}"
"""

RETURN = r"""
_value:
  description: One C(<key> <recorded> -> <declared>) per difference; empty when the record is as declared.
  type: list
  elements: str
"""

import re

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_text
from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import parse_node

# the record's field each declared key is shown as, and its value when the record lacks it
_FIELDS = {"RealMemory": ("RealMemory", None), "MemSpecLimit": ("MemSpecLimit", "0"),
           "Gres": ("Gres", ""), "CPUs": ("CPUTot", None)}


def _gres(value):
    items = (re.sub(r"\(S:[^)]*\)$", "", item.strip()) for item in to_text(value).split(","))
    return ",".join(sorted(item for item in items if item and item != "(null)"))


def _gres_counts(text):
    """{name: {type or None: count}} of a GRES list as _gres writes it."""
    counts = {}
    for item in text.split(",") if text else ():
        parts = item.split(":")
        name, kind = parts[0], parts[1] if len(parts) == 3 else None
        count = parts[-1] if len(parts) > 1 else "1"
        counts.setdefault(name, {})[kind] = count
    return counts


def _gres_same(have, want):
    """A GRES declared without a type (gpu:2) is what a record with one shows (gpu:a100:2, the type
    found by autodetection): the count per name is compared then."""
    have, want = _gres_counts(have), _gres_counts(want)
    if set(have) != set(want):
        return False
    for name, kinds in want.items():
        if list(kinds) == [None]:
            try:
                total = sum(int(count) for count in have[name].values())
            except ValueError:
                return False
            if to_text(total) != kinds[None]:
                return False
        elif kinds != have[name]:
            return False
    return True


def _normal(key, value):
    if value is None:
        return None
    return _gres(value) if key == "Gres" else to_text(value).strip()


def slurm_record_drift(record, declared):
    """'<key> <recorded> -> <declared>' for each declared key the record shows otherwise."""
    if not isinstance(declared, dict):
        raise AnsibleFilterError("slurm_record_drift expects a dict of declared values, got %s"
                                 % type(declared).__name__)
    record = to_text(record or "")
    fields = parse_node(record)
    if not fields.get("NodeName"):
        raise AnsibleFilterError("slurm_record_drift: %r is not a node's line from scontrol show node" % record[:200])
    drift = []
    for key, value in declared.items():
        if key not in _FIELDS:
            raise AnsibleFilterError("slurm_record_drift: cannot compare %s (only %s)" % (key, ", ".join(_FIELDS)))
        field, missing = _FIELDS[key]
        have = _normal(key, fields.get(field, missing))
        want = _normal(key, value)
        if have != want and not (key == "Gres" and _gres_same(have, want)):
            drift.append("%s %s -> %s" % (key, have if have not in (None, "") else "none", want or "none"))
    return drift


class FilterModule(object):
    def filters(self):
        return {"slurm_record_drift": slurm_record_drift}
