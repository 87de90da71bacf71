# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The first of several modules this control node has: a role's choice between collections that moved."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: first_module
short_description: The first of the given modules that the control node can run
version_added: 0.1.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Takes module names (FQCN) in order of preference and returns the first one installed on this control node
    that resolves to a module of the collection it names. A name that only resolves through a redirect to another
    collection counts as absent unless O(follow_redirects) is set.
  - Used where a module moved between collections across the C(ansible) package's releases (community.mysql's
    MariaDB modules to ansible.mariadb in C(ansible) 14). The role runs the newest one installed and keeps working
    where only the older collection is.
  - Fails, naming every candidate, when none is installed.
options:
  _terms:
    description: Module names, most preferred first.
    required: true
  follow_redirects:
    description: Count a name that resolves only through a redirect (a deprecated name) as installed.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Choose the MariaDB modules
  ansible.builtin.set_fact:
    __mariadb_db_module: "{{ lookup('converged.hpc.first_module', 'ansible.mariadb.mariadb_db', 'community.mysql.mysql_db') }}"
"""

RETURN = r"""
_raw:
  description: The first installed module's name, as given.
  type: list
  elements: str
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.loader import module_loader
from ansible.plugins.lookup import LookupBase


def resolves(name, follow_redirects=False):
    """True when the module name resolves on this control node (to itself, or through a redirect if allowed)."""
    try:
        context = module_loader.find_plugin_with_context(name, ignore_deprecated=True)
    # a collection that cannot load counts as not installed
    except Exception:  # pylint: disable=broad-except
        return False
    if not context.resolved:
        return False
    if follow_redirects:
        return True
    return context.resolved_fqcn == name or context.plugin_resolved_name == name


def first(names, follow_redirects=False):
    """The first name that resolves; AnsibleLookupError naming them all when none does."""
    for name in names:
        if resolves(name, follow_redirects):
            return name
    raise AnsibleLookupError("none of these modules is installed on the control node: %s (install the collection "
                             "of the first, e.g. with ansible-galaxy collection install)" % ", ".join(names))


class LookupModule(LookupBase):
    """Returns the first installed module of the terms."""

    def run(self, terms, variables=None, **kwargs):
        names = [str(term) for term in terms]
        bad = [name for name in names if name.count(".") != 2]
        if not names or bad:
            raise AnsibleLookupError("first_module takes module names as namespace.collection.module; got %s"
                                     % (", ".join(repr(n) for n in bad) if bad else "none"))
        self.set_options(var_options=variables, direct=kwargs)
        return [first(names, self.get_option("follow_redirects"))]
