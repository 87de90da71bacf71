# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""converged.hpc.tick - an event every ``interval`` seconds, for rules that poll (the autoscaler).

    {"tick": {"index": 3, "time": 1732350000.0, "name": "autoscale", "interval": 60.0}}

The first comes at once. ansible-rulebook runs a ruleset's actions one after another, so
when a run lasts longer than the interval the ticks that came meanwhile wait behind it. Each
carries its interval: a tick older than that when its run starts has a newer one queued
behind it, and autoscale.yml ends such a run at once (docs/autoscale.md).
"""

from __future__ import absolute_import, division, print_function

import asyncio
import time

DOCUMENTATION = r"""
---
short_description: An event every interval seconds
description:
  - Emits C({"tick": {"index", "time", "name", "interval"}}) at once and then every O(interval) seconds.
options:
  interval:
    description: Seconds between two events (default 60, at least 1).
  name:
    description: Carried in each event, to tell several tick sources apart (default tick).
  limit:
    description: Stop after this many events (default 0, never).
"""

EXAMPLES = r"""
- name: Autoscale Slurm's compute
  hosts: all,localhost
  sources:
    - converged.hpc.tick:
        interval: 60
        name: autoscale
  rules:
    - name: Autoscale
      condition: event.tick is defined
      action:
        run_playbook:
          name: converged.hpc.autoscale
"""


def settings(args):
    """interval, name and limit from the source's arguments; ValueError naming a bad one."""
    args = dict(args or {})
    try:
        interval = float(args.get("interval", 60))
    except (TypeError, ValueError):
        raise ValueError("converged.hpc.tick: interval %r is not a number of seconds" % (args.get("interval"),)) from None
    if interval < 1:
        raise ValueError("converged.hpc.tick: interval %r is below 1 second" % (args.get("interval"),))
    try:
        limit = int(args.get("limit", 0))
    except (TypeError, ValueError):
        raise ValueError("converged.hpc.tick: limit %r is not a whole number" % (args.get("limit"),)) from None
    return interval, str(args.get("name", "tick")), limit


async def main(queue, args):
    """ansible-rulebook's entry point."""
    interval, name, limit = settings(args)
    index = 0
    start = time.monotonic()
    while not limit or index < limit:
        await queue.put({"tick": {"index": index, "time": time.time(), "name": name, "interval": interval}})
        index += 1
        # on a fixed grid: a slow consumer does not stretch the interval
        await asyncio.sleep(max(0.0, start + index * interval - time.monotonic()))


if __name__ == "__main__":
    class _Printer:
        async def put(self, event):
            import json  # pylint: disable=import-outside-toplevel
            print(json.dumps(event), flush=True)

    asyncio.run(main(_Printer(), {"interval": 1, "limit": 3}))
