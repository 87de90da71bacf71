# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm.conf-style key=value rendering, written once for slurm.conf, the
partition lines and the options a dynamic slurmd registers with."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_conf
short_description: Render a dict as Slurm key=value pairs
version_added: 0.2.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Turns a dict into C(Key=Value) pairs as slurm.conf, its NodeSet/PartitionName lines and
    C(slurmd --conf) expect, in the dict's order.
  - A list value is joined with commas; a boolean becomes C(YES) or C(NO); C(None), empty strings
    and empty lists are left out, so optional settings can stay in the dict.
  - A value with a space is refused, since Slurm would read it as two settings, except with O(quote).
positional: sep
options:
  _input:
    description: The settings.
    type: dict
    required: true
  sep:
    description: What separates the pairs (a space for one line, a newline for one setting per line).
    type: str
    default: " "
  quote:
    description: Keys whose values may hold spaces; they are written in double quotes.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
# ClusterName=hpc\nSlurmctldParameters=enable_configless
settings: "{{ {'ClusterName': 'hpc', 'SlurmctldParameters': ['enable_configless'], 'TreeWidth': ''}
              | converged.hpc.slurm_conf('\n') }}"
# PartitionName=compute Nodes=computeset Default=YES
line: "{{ {'PartitionName': 'compute', 'Nodes': ['computeset'], 'Default': true} | converged.hpc.slurm_conf }}"
"""

RETURN = r"""
_value:
  description: The pairs, joined by O(sep).
  type: str
"""

from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.text.converters import to_text


def _value(key, value, quote):
    if isinstance(value, bool):
        return "YES" if value else "NO"
    if isinstance(value, (list, tuple)):
        text = ",".join(to_text(v) for v in value if v is not None and to_text(v) != "")
    else:
        text = to_text(value)
    if key in quote:
        return '"%s"' % text.replace('"', '\\"')
    if any(c.isspace() for c in text):
        raise AnsibleFilterError("slurm_conf: %s=%r holds whitespace, which Slurm would read as another setting"
                                 % (key, text))
    return text


def slurm_conf(settings, sep=" ", quote=None):
    """Key=Value pairs of a dict, empty values left out."""
    if not isinstance(settings, dict):
        raise AnsibleFilterError("slurm_conf expects a dict, got %s" % type(settings).__name__)
    quote = set(quote or ())
    pairs = []
    for key, value in settings.items():
        if value is None or (isinstance(value, (str, list, tuple, dict)) and len(value) == 0):
            continue
        pairs.append("%s=%s" % (key, _value(key, value, quote)))
    return sep.join(pairs)


class FilterModule(object):
    def filters(self):
        return {"slurm_conf": slurm_conf}
