# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""converged.hpc.tick - an event every ``interval`` seconds, for rules that poll (the autoscaler).

    {"tick": {"index": 3, "time": 1732350000.0, "name": "autoscale", "interval": 60.0,
              "stamp": "/tmp/converged-hpc-tick-0/autoscale"}}

The first comes at once. ansible-rulebook runs a ruleset's actions one after another, so
when a run lasts longer than the interval the ticks that came meanwhile wait behind it. The
stamp is a file of this source's name (0600, in a 0700 directory of the user's, emptied when the
source starts; ansible-rulebook stops without cleaning up, so it stays): a playbook answering ticks
writes in it the time its full run starts, and ends at once the run of a tick that came before
that time - a run since has already answered it. The first tick after a full run's start
always runs in full, however slow the machine (docs/autoscale.md).
"""

from __future__ import absolute_import, division, print_function

import asyncio
import os
import re
import stat
import tempfile
import time

DOCUMENTATION = r"""
---
short_description: An event every interval seconds
description:
  - Emits C({"tick": {"index", "time", "name", "interval", "stamp"}}) at once and then every O(interval) seconds.
  - C(stamp) is a file the source empties when it starts (mode 0600, one per O(name), in a private directory
    of the user's under the temporary directory), where a playbook records the time its last full run started,
    to end at once the runs of ticks that run has answered.
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


def make_stamp(name):
    """The stamp file of the source NAME, emptied: in a directory only this user may write to."""
    directory = os.path.join(tempfile.gettempdir(), "converged-hpc-tick-%d" % os.getuid())
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
        raise ValueError("converged.hpc.tick: %s is not a private directory of this user (mode 0700)" % directory)
    path = os.path.join(directory, re.sub(r"[^A-Za-z0-9_.-]", "_", name))
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
    return path


async def main(queue, args):
    """ansible-rulebook's entry point."""
    interval, name, limit = settings(args)
    stamp = make_stamp(name)
    index = 0
    start = time.monotonic()
    while not limit or index < limit:
        await queue.put({"tick": {"index": index, "time": time.time(), "name": name, "interval": interval,
                                  "stamp": stamp}})
        index += 1
        # on a fixed grid: a slow consumer does not stretch the interval
        await asyncio.sleep(max(0.0, start + index * interval - time.monotonic()))


if __name__ == "__main__":
    class _Printer:
        async def put(self, event):
            import json  # pylint: disable=import-outside-toplevel
            print(json.dumps(event), flush=True)

    asyncio.run(main(_Printer(), {"interval": 1, "limit": 3}))
