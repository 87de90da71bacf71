#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: lease
short_description: Serialise runs with a Kubernetes Lease in the management cluster
version_added: 0.2.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Takes or gives back a C(Lease) (coordination.k8s.io/v1) as a lock, so that two runs of the reconcile,
    scale-up or scale-down playbooks (two AWX jobs, an event and a schedule) never act on the cluster at once.
  - C(acquired) creates the Lease or takes it over when it has no holder or its holder stopped renewing it
    (C(renewTime) + C(leaseDurationSeconds) past, or its resourceVersion unchanged for longer than that as this
    module watched it). Otherwise it waits, at most O(timeout) seconds, then fails naming the holder.
  - Every write carries the resourceVersion it was computed from; of two runs racing, one gets 409 and waits.
  - With O(renew), a detached process renews the Lease every O(duration)/3 seconds for as long as the
    C(ansible-playbook) run that took it lives and the Lease is still its own. A killed run stops renewing and
    its Lease lapses after O(duration) seconds - unlike a lock file, it never needs cleaning by hand.
  - Taking a Lease already held by the same O(holder) renews it (nested use in one run is safe).
  - C(released) gives the Lease back (clears the holder) when O(holder) holds it, and does nothing otherwise.
options:
  name:
    description: Lease name.
    type: str
    default: converged-hpc
  namespace:
    description: Namespace of the Lease (it must exist).
    type: str
    default: default
  state:
    description: Take the Lease or give it back.
    type: str
    choices: [acquired, released]
    default: acquired
  holder:
    description:
      - Who holds it, as C(holderIdentity). The default names the control node and the C(ansible-playbook) run
        (C(<hostname> ansible-playbook pid <pid>)), the same for every task of one run. Give the AWX job too
        when there is one, for example C({{ lookup('env', 'HOSTNAME') }} job {{ awx_job_id }}).
    type: str
  duration:
    description: C(leaseDurationSeconds) - how long the Lease stays ours without a renewal.
    type: int
    default: 60
  timeout:
    description: Seconds to wait for another holder to give the Lease back or let it lapse.
    type: int
    default: 1800
  poll:
    description: Seconds between attempts while waiting.
    type: float
    default: 2
  renew:
    description:
      - With C(acquired), keep the Lease renewed from a detached process while this C(ansible-playbook) run
        lives. Needs the module to run on the control node (C(delegate_to) C(localhost)).
    type: bool
    default: true
extends_documentation_fragment:
  - kubernetes.core.k8s_auth_options
attributes:
  check_mode:
    support: full
    description: Reads the Lease and says whether it would be taken or given back; writes nothing, waits for nobody.
notes:
  - RBAC - get, create and update on C(leases.coordination.k8s.io) in O(namespace).
  - Hosts' clocks may differ; a Lease whose holder's clock runs ahead is still taken over once this module has
    seen it unchanged for O(duration) seconds.
requirements:
  - kubernetes (Python library)
"""

EXAMPLES = r"""
- name: Take the reconcile Lease (wait for another run at most 30 minutes)
  converged.hpc.lease:
    name: converged-hpc-reconcile
    namespace: slurm
  delegate_to: localhost

- name: Give it back
  converged.hpc.lease:
    name: converged-hpc-reconcile
    namespace: slurm
    state: released
  delegate_to: localhost
"""

RETURN = r"""
holder:
  description: The holder this module acted for.
  returned: always
  type: str
previous_holder:
  description: The holder before this module took the Lease (a lapsed run's, or none), or the holder found by C(released).
  returned: always
  type: str
waited:
  description: Seconds spent waiting for another holder.
  returned: when state is acquired
  type: float
renewer_pid:
  description: PID of the detached process renewing the Lease.
  returned: when state is acquired and renew is true
  type: int
lease:
  description: The Lease's spec after the change.
  returned: when state is acquired
  type: dict
"""

from ansible_collections.converged.hpc.plugins.module_utils.capi_lease import (
    LEASE_ARGUMENT_SPEC,
    lease_task,
)
from ansible_collections.converged.hpc.plugins.module_utils.capi_task import module_main


def main():
    module_main(LEASE_ARGUMENT_SPEC, lease_task)


if __name__ == "__main__":
    main()
