#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: pool_info
short_description: Read a bare-metal pool - MachineDeployments, Metal3MachineTemplates, BareMetalHosts, Machines
version_added: 0.6.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Lists a namespace's MachineDeployments, Metal3MachineTemplates, BareMetalHosts and Machines (those of
    O(kinds)) at once, one request each in parallel, without their C(managedFields) - what C(move.yml) and
    C(rebalance.yml) plan from and wait on.
  - On the control node (delegated to C(localhost)) the action plugin does the work in Ansible's own process,
    so a wait that reads every second costs a request, not a module's start-up.
options:
  namespace:
    description: The pool's namespace.
    type: str
    required: true
  kinds:
    description: What to list.
    type: list
    elements: str
    choices: [deployments, templates, hosts, machines, machinesets]
    default: [deployments, templates, hosts, machines]
  api_version:
    description: The Cluster API version (MachineDeployments, Machines).
    type: str
    default: cluster.x-k8s.io/v1beta2
  metal3_api_version:
    description: The Metal3MachineTemplates' version.
    type: str
    default: infrastructure.cluster.x-k8s.io/v1beta2
  machine_selector:
    description: A label selector for the Machines and MachineSets (e.g. C(cluster.x-k8s.io/deployment-name=hpc-gpu)).
    type: str
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    support: full
    description: It only reads.
notes:
  - RBAC - C(list) on machinedeployments, machines (cluster.x-k8s.io), metal3machinetemplates
    (infrastructure.cluster.x-k8s.io) and baremetalhosts (metal3.io), and machinesets when asked, those of O(kinds).
"""

EXAMPLES = r"""
- name: Read the pool
  converged.hpc.pool_info:
    namespace: metal3
  register: pool
  delegate_to: localhost

- name: Wait until the hosts are available
  converged.hpc.pool_info:
    namespace: metal3
    kinds: [hosts]
  register: pool
  until: pool.hosts | map(attribute='status.provisioning.state') | select('equalto', 'available') | list | length > 0
  retries: 600
  delay: 1
  delegate_to: localhost
"""

RETURN = r"""
deployments:
  description: The MachineDeployments.
  returned: when asked
  type: list
  elements: dict
templates:
  description: The Metal3MachineTemplates.
  returned: when asked
  type: list
  elements: dict
hosts:
  description: The BareMetalHosts.
  returned: when asked
  type: list
  elements: dict
machines:
  description: The Machines (those O(machine_selector) selects).
  returned: when asked
  type: list
  elements: dict
machinesets:
  description: The MachineSets (those O(machine_selector) selects).
  returned: when asked
  type: list
  elements: dict
"""

from ansible_collections.converged.hpc.plugins.module_utils.capi_pool import (
    POOL_INFO_ARGUMENT_SPEC,
    pool_info_task,
)
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import module_main


def main():
    module_main(POOL_INFO_ARGUMENT_SPEC, pool_info_task)


if __name__ == "__main__":
    main()
