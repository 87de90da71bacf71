#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: machine_hook
short_description: Put or release a Cluster API deletion hook on a Machine
version_added: 0.5.0
author: converged.hpc contributors (@converged-hpc)
description:
  - A deletion hook is one annotation on a Machine (C(pre-terminate.delete.hook.machine.cluster.x-k8s.io/<name>)
    or C(pre-drain...)). While it is there Cluster API does not deprovision the Machine, even once it is
    deleted. The lifecycle playbooks put this collection's hook on every Slurm compute Machine before its
    node takes jobs, and release it when the node is out of Slurm.
  - Reads the Machine, then changes only that annotation, with a JSON merge patch that carries the
    resourceVersion it was read at. If the Machine changed in between, the API answers 409 and the module
    reads it again (5 tries).
  - Releasing the hook of a Machine that does not exist (any more) changes nothing and succeeds. Putting
    one on it fails, naming it.
  - On the control node (delegated to C(localhost)) the action plugin does the work in Ansible's own process,
    about 0.1 s instead of a module run of about 1 s. Elsewhere the module runs on the task's host and needs
    the C(kubernetes) Python library there.
options:
  name:
    description: The Machine's name.
    type: str
    required: true
  namespace:
    description: The Machine's namespace.
    type: str
    required: true
  api_version:
    description: The Machine's API version, as the C(converged.hpc.capi_machines) inventory gives it (C(capi.api_version)).
    type: str
    default: cluster.x-k8s.io/v1beta1
  hook:
    description: The hook's annotation key, C(pre-terminate.delete.hook.machine.cluster.x-k8s.io/<name>) or
      C(pre-drain.delete.hook.machine.cluster.x-k8s.io/<name>). Anything else is refused before any request.
    type: str
    required: true
  owner:
    description: The annotation's value when it is put. Cluster API reads it as the hook's owner.
    type: str
    default: converged-hpc
  state:
    description: C(present) puts the hook when the Machine lacks it, C(absent) releases it when it is there.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    support: full
    description: Reads the Machine and reports whether it would change it; writes nothing.
notes:
  - RBAC - C(get) and C(patch) on C(machines.cluster.x-k8s.io) in the Machine's namespace.
"""

EXAMPLES = r"""
- name: Hold the Machine until scale_down.yml has taken its node out of Slurm
  converged.hpc.machine_hook:
    name: "{{ capi.name }}"
    namespace: "{{ capi.namespace }}"
    api_version: "{{ capi.api_version }}"
    hook: pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc
  delegate_to: localhost

- name: Let Cluster API deprovision it
  converged.hpc.machine_hook:
    name: "{{ capi.name }}"
    namespace: "{{ capi.namespace }}"
    hook: pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc
    state: absent
  delegate_to: localhost
"""

RETURN = r"""
exists:
  description: Whether the Machine exists.
  returned: success
  type: bool
hook:
  description: The hook acted on.
  returned: success
  type: str
annotations:
  description: The Machine's annotations after the change (empty when it does not exist).
  returned: success
  type: dict
deleting:
  description: Whether the Machine has a deletionTimestamp (Cluster API is deleting it).
  returned: success
  type: bool
"""

from ansible_collections.converged.hpc.plugins.module_utils.capi_hook import (
    HOOK_ARGUMENT_SPEC,
    hook_task,
)
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import module_main


def main():
    module_main(HOOK_ARGUMENT_SPEC, hook_task)


if __name__ == "__main__":
    main()
