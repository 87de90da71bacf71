#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: slurm_queue
short_description: Read Slurm's demand (pending jobs) and supply (nodes) for the autoscaler
version_added: 0.4.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Runs on a host with the Slurm client tools and a working munge (the controller). Reads only; never
    changes anything.
  - Pending jobs (C(squeue --array --states=PENDING)), one per array task, with what each needs - nodes,
    CPUs, memory per node, features, generic resources (GRES, as C(gpu:a100:2)) - and why it pends. Only a job pending for a reason more nodes could
    remove (C(runnable) in RV(jobs)) counts as demand - C(Resources), C(Priority), C(PartitionConfig) (a
    partition whose nodeset is empty), C(PartitionNodeLimit), C(NodeDown), C(ReqNodeNotAvail), the scheduler's text
    C(Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority partitions) (its
    partition's nodes are not there yet) and C(None) (not yet looked at by the scheduler). Held jobs, dependencies (also the ones of a job the
    scheduler has not looked at yet), begin times, reservations and association or QOS limits never do.
  - Every node (C(scontrol show node --oneliner)) with its state, features, partitions and, for an idle
    node, for how long it has been idle (from Slurm's C(LastBusyTime), else C(SlurmdStartTime)).
  - The partitions Slurm knows (C(scontrol show partition)).
  - A query that fails fails the module with Slurm's message, so that no answer is never read as an empty queue.
options:
  partitions:
    description: Only pending jobs that may run in one of these partitions; empty reads them all.
    type: list
    elements: str
    default: []
  running:
    description:
      - Also read the running jobs (C(squeue --states=RUNNING,COMPLETING)) into RV(running), each with the
        nodes it runs on and when its time limit ends - what C(playbooks/rollout.yml) orders old nodes by.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: The module only reads.
notes:
  - The decision from what it reads is the filter converged.hpc.autoscale_plan's (playbooks/autoscale.yml).
"""

EXAMPLES = r"""
- name: Read the queue and the nodes
  converged.hpc.slurm_queue:
  register: queue
  delegate_to: "{{ groups['converged_controller'][0] }}"
"""

RETURN = r"""
jobs:
  description: The pending jobs (one per array task), in submission order.
  returned: always
  type: list
  elements: dict
  sample:
    - {"id": "42", "partitions": ["compute"], "nodes": 2, "cpus": 2, "memory_mib": 0, "features": "",
       "gres": [], "reason": "PartitionConfig", "runnable": true}
nodes:
  description: Every Slurm node.
  returned: always
  type: list
  elements: dict
  sample:
    - {"name": "cn-01", "state": "IDLE", "flags": ["DYNAMIC_NORM"], "available": true, "busy": false,
       "features": ["compute"], "partitions": ["compute"], "cpus": 2, "idle_seconds": 75}
running:
  description: With O(running), the running and completing jobs (one per array task).
  returned: when O(running)
  type: list
  elements: dict
  sample:
    - {"id": "51", "state": "RUNNING", "end": 1764672000.0, "nodes": ["cn-01", "cn-02"]}
partitions:
  description: The partitions Slurm knows.
  returned: always
  type: list
  elements: str
now:
  description: The controller's clock (epoch seconds) when the nodes were read.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.converged.hpc.plugins.module_utils.slurm_text import (
    memory_mib, parse_node, slurm_time)

# why a pending job waits, when more nodes would start it
# squeue's %r is the scheduler's own text where it wrote one: "Nodes required for job are DOWN, DRAINED
# [, REBOOTING] or reserved for jobs in higher priority partitions" (reason Resources) is what 24.11 says of
# a job whose partition holds only nodes not there yet (placeholders) - compared up to its first comma
RUNNABLE = frozenset(("Resources", "Priority", "PartitionConfig", "PartitionNodeLimit", "NodeDown",
                      "ReqNodeNotAvail", "Nodes required for job are DOWN", "None"))
BUSY = frozenset(("ALLOCATED", "MIXED", "COMPLETING"))
# flags that take a node out of service
UNAVAILABLE = frozenset(("DRAIN", "DRAINING", "DRAINED", "NOT_RESPONDING", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED",
                         "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "RESERVED"))
# %E: the job's remaining dependencies - a job just submitted with one pends for None until
# the scheduler first looks at it; it must not count as demand meanwhile
SQUEUE_FORMAT = "%i;%P;%D;%C;%m;%r;%b;%E;%f"
# a running job: its id, state, when its time limit ends (%e: Unknown or NONE without one) and its nodes (a
# hostlist such as cn-[01-02], expanded by scontrol show hostnames)
RUNNING_FORMAT = "%i;%T;%e;%N"


def parse_gres(text):
    """squeue's %b (C(gres:gpu:2), C(gres/gpu:a100:2), C(N/A)) to C([gpu:2]), C([gpu:a100:2]), C([])."""
    if text in ("N/A", "(null)", ""):
        return []
    out = []
    for item in text.split(","):
        for prefix in ("gres:", "gres/"):
            if item.startswith(prefix):
                item = item[len(prefix):]
        if item:
            out.append(item)
    return out


def parse_jobs(text):
    """squeue output in SQUEUE_FORMAT to job dicts."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split(";", 8)
        if len(fields) != 9:
            raise ValueError("unexpected squeue line %r" % line)
        job_id, partitions, nodes, cpus, memory, reason, gres, dependency, features = [f.strip() for f in fields]
        waits_for_jobs = dependency not in ("(null)", "")
        reason_key = reason.split(",")[0]
        jobs.append({"id": job_id, "partitions": [p for p in partitions.split(",") if p],
                     "nodes": int(nodes) if nodes.isdigit() else 1, "cpus": int(cpus) if cpus.isdigit() else 1,
                     "memory_mib": memory_mib(memory), "features": "" if features in ("(null)", "") else features,
                     "gres": parse_gres(gres),
                     "reason": "Dependency" if waits_for_jobs and reason_key == "None" else reason,
                     "runnable": reason_key in RUNNABLE and not waits_for_jobs})
    return jobs


def parse_running(text):
    """squeue output in RUNNING_FORMAT to job dicts; their nodes still hostlists (C(cn-[01-02]))."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(";", 3)]
        if len(fields) != 4:
            raise ValueError("unexpected squeue line %r" % line)
        job_id, state, end, nodes = fields
        jobs.append({"id": job_id, "state": state, "end": slurm_time(end),
                     "nodes": "" if nodes in ("(null)", "") else nodes})
    return jobs


def node_record(raw, now):
    """scontrol's node dict to what the autoscaler reads."""
    parts = (raw.get("State") or "UNKNOWN").split("+")
    state, flags = parts[0].rstrip("*"), parts[1:]
    available = state not in ("DOWN", "FUTURE", "UNKNOWN") and not UNAVAILABLE.intersection(flags)
    record = {"name": raw.get("NodeName"), "state": state, "flags": flags, "available": available,
              "busy": state in BUSY or "COMPLETING" in flags,
              "features": [f for f in (raw.get("AvailableFeatures") or "").split(",") if f and f != "(null)"],
              "partitions": [p for p in (raw.get("Partitions") or "").split(",") if p and p != "(null)"],
              "cpus": int(raw["CPUTot"]) if (raw.get("CPUTot") or "").isdigit() else None,
              "idle_seconds": None}
    if state == "IDLE" and not record["busy"]:
        # a node that never ran a job: idle since slurmd started
        since = slurm_time(raw.get("LastBusyTime")) or slurm_time(raw.get("SlurmdStartTime"))
        record["idle_seconds"] = max(0, int(now - since)) if since else None
    return record


def main():
    module = AnsibleModule(argument_spec={"partitions": {"type": "list", "elements": "str", "default": []},
                                          "running": {"type": "bool", "default": False}},
                           supports_check_mode=True)

    def run(args, what):
        rc, out, err = module.run_command(args)
        if rc != 0:
            module.fail_json(msg="%s failed (rc %d): %s" % (what, rc, (err or out).strip()))
        return out

    squeue = ["squeue", "--noheader", "--array", "--states=PENDING", "--sort=V,i", "--format", SQUEUE_FORMAT]
    if module.params["partitions"]:
        squeue += ["--partition", ",".join(module.params["partitions"])]
    try:
        jobs = parse_jobs(run(squeue, "squeue"))
    except ValueError as exc:
        module.fail_json(msg="squeue: %s" % exc)
    now = time.time()
    out = run(["scontrol", "show", "node", "--oneliner"], "scontrol show node")
    nodes = [node_record(parse_node(line), now) for line in out.splitlines() if line.startswith("NodeName=")]
    out = run(["scontrol", "show", "partition", "--oneliner"], "scontrol show partition")
    partitions = [parse_node(line).get("PartitionName") for line in out.splitlines()
                  if line.startswith("PartitionName=")]
    result = dict(changed=False, jobs=jobs, nodes=nodes, partitions=partitions, now=now)
    if module.params["running"]:
        squeue = ["squeue", "--noheader", "--array", "--states=RUNNING,COMPLETING", "--format", RUNNING_FORMAT]
        try:
            running = parse_running(run(squeue, "squeue"))
        except ValueError as exc:
            module.fail_json(msg="squeue: %s" % exc)
        expanded = {}
        for job in running:
            hostlist = job["nodes"]
            if hostlist and hostlist not in expanded:
                expanded[hostlist] = hostlist.split(",") if "[" not in hostlist else \
                    run(["scontrol", "show", "hostnames", hostlist], "scontrol show hostnames").split()
            job["nodes"] = expanded.get(hostlist, [])
        result["running"] = running
    module.exit_json(**result)


if __name__ == "__main__":
    main()
