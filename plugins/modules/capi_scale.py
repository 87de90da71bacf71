#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: capi_scale
short_description: Change a MachineDeployment's replicas as one decision, the Machines to go marked first
version_added: 0.6.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Changes the replicas of a Cluster API MachineDeployment (or MachineSet) through its C(/scale)
    subresource, with a JSON patch that tests the replicas read first. A concurrent change of the replicas
    makes the server refuse it instead of losing one of the two. A real kube-apiserver refuses a strategic
    merge patch on a custom resource's C(/scale) (415); this module never sends one.
  - For a scale-down, the Machines of O(delete_machines) are marked C(cluster.x-k8s.io/delete-machine)
    first, so that Cluster API deletes them and no other. O(annotations) are written on the
    MachineDeployment before the replicas change (the autoscaler's scale-up time).
  - When marking or scaling fails, the marks and annotations it wrote are put back, and the task fails
    naming what happened. When even that fails (the API gone mid-way), a mark is left on a Machine that no
    scale-down will delete. Every run first takes back such stale marks (its own O(delete_reason), on a
    Machine not being deleted, while the MachineDeployment has no more Machines than replicas).
  - With O(current_replicas) and other replicas on the server, nothing changes and the result says so
    (C(conflict)).
  - On the control node (delegated to C(localhost)) the action plugin does the work in Ansible's own process.
options:
  name:
    description: The MachineDeployment's (or MachineSet's) name.
    type: str
    required: true
  namespace:
    description: Its namespace, which its Machines share.
    type: str
    required: true
  kind:
    description: What to scale.
    type: str
    choices: [MachineDeployment, MachineSet]
    default: MachineDeployment
  api_version:
    description: The Cluster API version, as the C(converged.hpc.capi_machines) inventory gives it (C(capi.api_version)).
    type: str
    default: cluster.x-k8s.io/v1beta2
  replicas:
    description: The replicas wanted.
    type: int
    required: true
  current_replicas:
    description: The replicas the decision was made from. When the server has others, nothing changes.
    type: int
  delete_machines:
    description:
      - Names of its Machines to delete on a scale-down (at most as many as the replicas go down by), marked
        C(cluster.x-k8s.io/delete-machine) before the replicas change. Refused, before any write, on a
        scale-up, for a Machine that is not its own or is already being deleted.
    type: list
    elements: str
    default: []
  delete_reason:
    description: The marks' value. Only marks with this value are ever taken back.
    type: str
    default: converged.hpc
  annotations:
    description: Annotations (string values) written on the MachineDeployment with the change; put back as they
      were when the change fails.
    type: dict
    default: {}
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    support: full
    description: Every write is sent with C(dryRun=All) (the server checks it, RBAC and the replicas' test
      included, and stores nothing); the result says what would change.
notes:
  - RBAC - C(get) and C(patch) on C(machinedeployments/scale) (or C(machinesets/scale)); C(list) and C(patch) on
    C(machines); C(get) and C(patch) on C(machinedeployments) when O(annotations) are given.
"""

EXAMPLES = r"""
- name: One idle node fewer, that node and no other
  converged.hpc.capi_scale:
    name: hpc-compute
    namespace: metal3
    current_replicas: 4
    replicas: 3
    delete_machines: [hpc-compute-7d9f8-abcde]
    delete_reason: "converged.hpc autoscale: idle"
  delegate_to: localhost

- name: Two more, remembering when
  converged.hpc.capi_scale:
    name: hpc-compute
    namespace: metal3
    current_replicas: 3
    replicas: 5
    annotations:
      converged.hpc/scaled-up-at: "{{ now().timestamp() | int | string }}"
  delegate_to: localhost
"""

RETURN = r"""
replicas:
  description: The replicas before the change.
  returned: success
  type: int
desired:
  description: The replicas after it (the server's, on a conflict).
  returned: success
  type: int
marked:
  description: The Machines marked to go.
  returned: success
  type: list
  elements: str
unmarked:
  description: Stale marks of O(delete_reason) taken back.
  returned: success
  type: list
  elements: str
conflict:
  description: Whether the server had other replicas than O(current_replicas) (nothing changed).
  returned: success
  type: bool
"""

from ansible_collections.converged.hpc.plugins.module_utils.capi_scale import (
    SCALE_ARGUMENT_SPEC,
    scale_task,
)
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import module_main


def main():
    module_main(SCALE_ARGUMENT_SPEC, scale_task)


if __name__ == "__main__":
    main()
