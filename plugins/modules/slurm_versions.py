#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: slurm_versions
short_description: Read which Slurm a host has installed, which runs, and what state it keeps
version_added: 0.6.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Reads only; never changes anything. Its results from every host decide whether a converge may start the
    Slurm it finds installed (filter C(converged.hpc.slurm_upgrade_check)).
  - The version of each Slurm program installed (C(slurmctld), C(slurmd), C(slurmdbd), C(sinfo) for the client
    commands), each read from the program itself (C(-V)) with a probe configuration of its own, since from
    Slurm 23.11 the client commands and slurmdbd read one before they print their version. sackd prints none; a
    login host's release is that of its client commands.
  - For each daemon that runs, the version of the program it runs, read from the running process's own
    executable, so that a package upgraded under a running daemon is seen as the old release it still is.
  - The job steps running on the host (C(slurmstepd) processes), jobs a restart of its Slurm would kill.
  - The controller's saved state in O(state_dir) (job and node state files) and the release that wrote it,
    read from the files' header.
  - With O(backup_dir), the age of the newest accounting dump there (C(playbooks/accounting_backup.yml)).
options:
  state_dir:
    description: slurmctld's StateSaveLocation; empty skips it.
    type: path
    default: ""
  backup_dir:
    description: Where accounting dumps are kept; empty skips it.
    type: path
    default: ""
attributes:
  check_mode:
    support: full
    description: The module only reads.
"""

EXAMPLES = r"""
- name: What Slurm each host has and runs
  converged.hpc.slurm_versions:
    state_dir: /var/lib/slurm/slurmctld
  register: slurm_versions
"""

RETURN = r"""
installed:
  description: The version of each Slurm program installed (null when it is not).
  returned: always
  type: dict
  sample: {"slurmctld": "24.11.5", "slurmd": null, "slurmdbd": null, "client": "24.11.5"}
running:
  description: For each daemon that runs, the version of the program the running process executes (null when it does not run).
  returned: always
  type: dict
  sample: {"slurmctld": "22.05.8", "slurmd": null, "slurmdbd": null}
job_steps:
  description: How many job steps (slurmstepd processes) run on the host.
  returned: always
  type: int
state:
  description: The saved controller state in I(state_dir) - its files, and the release that wrote them (null when unknown).
  returned: always
  type: dict
  sample: {"files": ["job_state", "node_state"], "release": "22.05"}
backup_age:
  description: Seconds since the newest file in I(backup_dir) was written; null when there is none.
  returned: always
  type: float
"""

import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

PROGRAMS = {"slurmctld": "slurmctld", "slurmd": "slurmd", "slurmdbd": "slurmdbd", "client": "sinfo"}
DAEMONS = ("slurmctld", "slurmd", "slurmdbd")
STATE_FILES = ("job_state", "node_state", "part_state", "resv_state", "trigger_state")
# the protocol version a state file header carries, by release (src/common/slurm_protocol_common.h:
# SLURM_<release>_PROTOCOL_VERSION, (number << 8) | 0; the REST API of the release has the same number)
PROTOCOLS = {number << 8: release for number, release in (
    (36, "20.11"), (37, "21.08"), (38, "22.05"), (39, "23.02"), (40, "23.11"), (41, "24.05"), (42, "24.11"),
    (43, "25.05"), (44, "25.11"), (45, "26.05"))}


def version_of(path):
    """The version a Slurm program prints for -V ("slurm 24.11.5", "slurm-wlm 24.11.5"), or None. It runs with a
    probe slurm.conf and slurmdbd.conf: from 23.11 the client commands and slurmdbd fail without a configuration."""
    probe = tempfile.mkdtemp(prefix="converged-hpc-slurm-version-")
    try:
        with open(os.path.join(probe, "slurm.conf"), "w") as fh:
            fh.write("ClusterName=probe\nSlurmctldHost=localhost\n")
        dbd = os.path.join(probe, "slurmdbd.conf")
        with open(dbd, "w") as fh:
            fh.write("StorageType=accounting_storage/mysql\n")
        os.chmod(dbd, 0o600)
        env = dict(os.environ, SLURM_CONF=os.path.join(probe, "slurm.conf"))
        out = subprocess.run([path, "-V"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                             universal_newlines=True, timeout=20, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    found = re.search(r"(\d+\.\d+\.\d+)", out)
    return found.group(1) if found else None


def which(name):
    for directory in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]:
        path = os.path.join(directory, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def processes():
    """{pid: (command name, executable path)} of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/comm" % entry) as fh:
                name = fh.read().strip()
            out[int(entry)] = (name, "/proc/%s/exe" % entry)
        except OSError:
            continue
    return out


def state_release(path):
    """The release that wrote a state file: its header is a packed string (the state's kind) followed by
    the protocol version (uint16, network order)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return None
    if len(head) < 6:
        return None
    size = struct.unpack(">I", head[:4])[0]
    if size <= 0 or size > 64 or len(head) < 4 + size + 2:
        return None
    protocol = struct.unpack(">H", head[4 + size:6 + size])[0]
    return PROTOCOLS.get(protocol)


def main():
    module = AnsibleModule(argument_spec=dict(state_dir=dict(type="path", default=""),
                                              backup_dir=dict(type="path", default="")),
                           supports_check_mode=True)
    installed = {}
    for key, program in PROGRAMS.items():
        path = which(program)
        installed[key] = version_of(path) if path else None
    running = dict.fromkeys(DAEMONS)
    steps = 0
    for name, exe in processes().values():
        if name == "slurmstepd":
            steps += 1
        elif name in running and running[name] is None:
            # the executable the process runs, even when the package replaced the file since
            running[name] = version_of(exe)
    state = {"files": [], "release": None}
    if module.params["state_dir"] and os.path.isdir(module.params["state_dir"]):
        found = [f for f in STATE_FILES if os.path.isfile(os.path.join(module.params["state_dir"], f))]
        state["files"] = found
        releases = [r for r in (state_release(os.path.join(module.params["state_dir"], f)) for f in found) if r]
        state["release"] = min(releases, key=lambda r: tuple(int(x) for x in r.split("."))) if releases else None
    backup_age = None
    if module.params["backup_dir"] and os.path.isdir(module.params["backup_dir"]):
        dumps = [p for p in glob.glob(os.path.join(module.params["backup_dir"], "*")) if os.path.isfile(p)]
        if dumps:
            backup_age = time.time() - max(os.path.getmtime(p) for p in dumps)
    module.exit_json(changed=False, installed=installed, running=running, job_steps=steps, state=state,
                     backup_age=backup_age)


if __name__ == "__main__":
    main()
