#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: slurm_node
short_description: Drain, resume or delete a Slurm node, waiting for its jobs
version_added: 0.1.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Runs on a host with the Slurm client tools and a working munge (the controller).
  - C(drained) sets the node to DRAIN (running jobs go on, no new ones start) and, with O(wait), waits
    until no job runs on it (state DRAINED). On timeout it fails naming the node and the job IDs, and
    changes nothing more.
  - C(absent) drains the node, waits until it is idle, then deletes it from Slurm
    (C(scontrol delete nodename=)). A node Slurm does not know is already absent. Running jobs are
    never stopped unless O(force) or O(immediate) is set; then they are requeued (C(scontrol requeue)), or
    cancelled when Slurm refuses to requeue them (not requeueable, not a batch job), and named in
    RV(requeued) and RV(cancelled).
  - Idle is proven twice, and only by queries that succeeded - no job on the node (C(squeue)) and the
    node's own state (C(scontrol show node)) neither ALLOCATED, MIXED nor COMPLETING. A query that fails
    (slurmctld restarting, a failover, a timeout, munge) never counts as idle - the module keeps polling
    and, when O(timeout) runs out, fails naming the error; nothing is deleted.
  - C(resumed) returns a drained node to service.
options:
  name:
    description: Slurm node name.
    type: str
    required: true
  state:
    description: Wanted state of the node.
    type: str
    choices: [drained, resumed, absent]
    default: drained
  reason:
    description: Drain reason (Slurm requires one).
    type: str
    default: converged.hpc scale-down
  wait:
    description: With C(drained), wait until no job runs on the node. C(absent) always waits.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for the node's jobs to finish.
    type: int
    default: 3600
  poll:
    description: Seconds between checks while waiting.
    type: float
    default: 2
  force:
    description:
      - With C(absent), when O(timeout) expires, requeue the jobs still running (cancel those Slurm cannot
        requeue) and delete the node, instead of failing.
    type: bool
    default: false
  immediate:
    description:
      - With C(absent), an urgent removal - do not wait for the jobs - drain the node, requeue its jobs at once
        (cancel those Slurm cannot requeue), wait until they have left the node (at most O(timeout)), then delete
        it. Never the default.
    type: bool
    default: false
  allow_absent:
    description:
      - With C(drained), a node Slurm does not know is not an error (RV(before) is C(absent), nothing changes), as
        when a scale-down is run again after it had deleted the node.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports what would change (drain, delete, resume) and the node's jobs, changing nothing.
notes:
  - Dynamic nodes (slurmd -Z) disappear from Slurm with C(absent); stop slurmd on the node afterwards,
    or it registers again.
"""

EXAMPLES = r"""
- name: Drain a node and wait for its jobs (at most one hour)
  converged.hpc.slurm_node:
    name: cn-07
    state: drained
    timeout: 3600
  delegate_to: "{{ groups['controller'][0] }}"

- name: Urgent removal - requeue the node's jobs now, then remove it
  converged.hpc.slurm_node:
    name: cn-07
    state: absent
    immediate: true
  delegate_to: "{{ groups['controller'][0] }}"

- name: Remove a node from Slurm once its jobs are done
  converged.hpc.slurm_node:
    name: cn-07
    state: absent
  delegate_to: "{{ groups['controller'][0] }}"
"""

RETURN = r"""
node:
  description: The node as C(scontrol show node --oneliner) reports it (after the change), empty when absent.
  returned: always
  type: dict
  sample: {"NodeName": "cn-07", "State": "IDLE+DRAIN+DYNAMIC_NORM", "Reason": "converged.hpc scale-down"}
jobs:
  description: IDs of the jobs running on the node when the module finished (or timed out).
  returned: always
  type: list
  elements: str
before:
  description: The node's state before the module acted, C(absent) when Slurm did not know it.
  returned: always
  type: str
waited:
  description: Seconds spent waiting for jobs.
  returned: always
  type: float
requeued:
  description: IDs of the jobs requeued because O(immediate) was set, or O(force) was set and O(timeout) ran out.
  returned: when jobs were requeued
  type: list
  elements: str
cancelled:
  description: IDs of the jobs cancelled (Slurm refused to requeue them) under O(immediate) or O(force).
  returned: when jobs were cancelled
  type: list
  elements: str
"""

import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import parse_node


BUSY_STATES = frozenset(("ALLOCATED", "MIXED", "COMPLETING"))
# seconds the jobs requeued or cancelled under force=true get to leave the node
EVICT_WAIT = 120


class QueryError(Exception):
    """A Slurm query that did not answer: never read as "no jobs" or "idle"."""


class SlurmNode:
    def __init__(self, module):
        self.module = module
        self.name = module.params["name"]

    def run(self, args, check=True):
        rc, out, err = self.module.run_command(args)
        if check and rc != 0:
            self.module.fail_json(msg="%s failed for node %s: %s"
                                  % (" ".join(args[:3]), self.name, (err or out).strip()))
        return rc, out, err

    def query_node(self):
        """The node's record, None when Slurm does not know it; QueryError when scontrol fails."""
        rc, out, err = self.run(["scontrol", "show", "node", "--oneliner", self.name], check=False)
        if rc != 0:
            text = (err or out).lower()
            if "not found" in text or "invalid node name" in text:
                return None
            raise QueryError("scontrol show node %s failed (rc %d): %s" % (self.name, rc, (err or out).strip()))
        node = parse_node(out) if out.strip() else {}
        if "State" not in node:
            raise QueryError("scontrol show node %s answered without a State: %r" % (self.name, out.strip()[:200]))
        return node

    def show(self, timeout=0, poll=2.0):
        """The node's record; while Slurm does not answer (a restart, a failover) ask again, at most timeout s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.query_node()
            except QueryError as exc:
                if time.monotonic() >= deadline:
                    self.module.fail_json(msg=str(exc))
                time.sleep(poll)

    def jobs(self):
        """IDs of the jobs on the node; QueryError when squeue fails (never "no jobs")."""
        rc, out, err = self.run(["squeue", "--noheader", "--nodelist", self.name, "--states", "RUNNING,COMPLETING,"
                                 "CONFIGURING,SUSPENDED,STOPPED", "--format", "%i"], check=False)
        if rc != 0:
            raise QueryError("squeue --nodelist %s failed (rc %d): %s" % (self.name, rc, (err or out).strip()))
        return [j for j in out.split() if j]

    @staticmethod
    def flags(node):
        return set(((node or {}).get("State") or "").split("+"))

    def drain(self, node, reason):
        if "DRAIN" in self.flags(node):
            return False
        if not self.module.check_mode:
            self.run(["scontrol", "update", "nodename=%s" % self.name, "state=drain", "reason=%s" % reason])
        return True

    def idle(self):
        """(idle, jobs, why not): idle only when squeue and scontrol both answered and both say so. A node
        that left Slurm meanwhile (another run deleted it: Slurm deletes no node a job runs on) is idle; squeue
        refuses its name ("Invalid node name"), which is then no failure to wait out."""
        try:
            jobs = self.jobs()
        except QueryError:
            if self.query_node() is None:
                return True, [], None
            raise
        node = self.query_node()
        if node is None:
            return True, [], None
        busy = self.flags(node) & BUSY_STATES
        if jobs:
            return False, jobs, "job(s) %s still run on it" % ", ".join(jobs)
        if busy:
            return False, jobs, "its state is %s" % node.get("State")
        return True, [], None

    def evict(self, jobs):
        """Requeue each job, or cancel it when Slurm refuses to requeue it: (requeued, cancelled)."""
        requeued, cancelled = [], []
        for job in jobs:
            rc, dummy, dummy = self.run(["scontrol", "requeue", job], check=False)
            if rc == 0:
                requeued.append(job)
                continue
            rc, out, err = self.run(["scancel", job], check=False)
            if rc != 0:
                self.module.fail_json(msg="node %s: job %s could neither be requeued nor cancelled: %s; the node "
                                      "stays drained and in Slurm" % (self.name, job, (err or out).strip()),
                                      requeued=requeued, cancelled=cancelled)
            cancelled.append(job)
        return requeued, cancelled

    def wait_idle(self, timeout, poll):
        """Poll until idle is proven; returns (jobs, seconds waited, why not idle or None)."""
        start = time.time()
        jobs, why = [], None
        while True:
            try:
                idle, jobs, why = self.idle()
                if idle:
                    return [], time.time() - start, None
            except QueryError as exc:  # slurmctld restarting, failing over...: keep the node, keep asking
                why = "Slurm did not answer: %s" % exc
            if time.time() - start >= timeout:
                return jobs, time.time() - start, why
            time.sleep(poll)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="drained", choices=["drained", "resumed", "absent"]),
            reason=dict(type="str", default="converged.hpc scale-down"),
            wait=dict(type="bool", default=True),
            timeout=dict(type="int", default=3600),
            poll=dict(type="float", default=2),
            force=dict(type="bool", default=False),
            immediate=dict(type="bool", default=False),
            allow_absent=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["timeout"] < 0:
        module.fail_json(msg="timeout=%s must not be negative" % p["timeout"])
    if not re.match(r"^[A-Za-z0-9_.\-\[\],]+$", p["name"]):
        module.fail_json(msg="name=%r is not a Slurm node name" % p["name"])
    if p["immediate"] and p["state"] != "absent":
        module.fail_json(msg="immediate=true only applies to state=absent, not state=%s" % p["state"])
    if not p["reason"].strip():
        module.fail_json(msg="reason must not be empty: Slurm requires a drain reason")
    slurm = SlurmNode(module)
    node = slurm.show(p["timeout"], p["poll"])
    before = (node or {}).get("State", "absent")
    result = dict(changed=False, before=before, node=node or {}, jobs=[], waited=0.0)

    if p["state"] == "resumed":
        if node is None:
            module.fail_json(msg="node %s is not known to Slurm: nothing to resume" % p["name"], **result)
        if slurm.flags(node) & {"DRAIN", "DOWN", "FAIL"}:
            result["changed"] = True
            if not module.check_mode:
                slurm.run(["scontrol", "update", "nodename=%s" % p["name"], "state=resume"])
        result["node"] = slurm.show() or {}
        module.exit_json(**result)

    if node is None:
        # absent already; drained cannot apply (unless allowed: a scale-down rerun finds it gone)
        if p["state"] == "drained" and not p["allow_absent"]:
            module.fail_json(msg="node %s is not known to Slurm: cannot drain it" % p["name"], **result)
        result["node"] = {}
        module.exit_json(**result)

    result["changed"] = slurm.drain(node, p["reason"])
    if module.check_mode:
        try:
            result["jobs"] = slurm.jobs()
        except QueryError as exc:
            module.fail_json(msg=str(exc), **result)
        if p["state"] == "absent":
            result["changed"] = True
        module.exit_json(**result)

    if p["state"] == "drained" and not p["wait"]:
        result["node"] = slurm.show() or {}
        try:
            result["jobs"] = slurm.jobs()
        except QueryError as exc:
            module.fail_json(msg=str(exc), **result)
        module.exit_json(**result)

    if p["immediate"]:
        try:
            running = slurm.jobs()
        except QueryError as exc:  # unknown jobs are never "none": fail, the node stays drained
            module.fail_json(msg="node %s: cannot list its jobs to requeue them: %s; it stays drained and in Slurm"
                             % (p["name"], exc), **result)
        if running:
            result["requeued"], result["cancelled"] = slurm.evict(running)
    jobs, waited, why = slurm.wait_idle(p["timeout"], p["poll"])
    result["waited"] = round(waited, 1)
    if why is not None and jobs and p["state"] == "absent" and p["force"]:
        requeued, cancelled = slurm.evict(jobs)
        result["requeued"] = result.get("requeued", []) + requeued
        result["cancelled"] = result.get("cancelled", []) + cancelled
        jobs, more, why = slurm.wait_idle(EVICT_WAIT, p["poll"])
        result["waited"] = round(waited + more, 1)
    if why is not None:
        result["jobs"] = jobs
        try:
            result["node"] = slurm.query_node() or {}
        except QueryError:
            result["node"] = {}
        tail = "" if p["state"] == "drained" else " and in Slurm" + (
            " (force=true or immediate=true requeues its jobs)" if jobs else "")
        if jobs and not why.startswith("Slurm did not answer"):
            msg = "node %s still runs job(s) %s after %d s; it stays drained%s" % (
                p["name"], ", ".join(jobs), p["timeout"], tail)
        else:
            msg = "node %s is not proven idle after %d s: %s; it stays drained%s" % (
                p["name"], p["timeout"], why, tail)
        module.fail_json(msg=msg, **result)

    if p["state"] == "absent":
        # unless another run deleted it while this one waited
        if slurm.show(p["timeout"], p["poll"]) is not None:
            slurm.run(["scontrol", "delete", "nodename=%s" % p["name"]])
        result["changed"] = True
        result["node"] = {}
    else:
        result["node"] = slurm.show() or {}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
