# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parsing of Slurm's text output, shared by the modules that read it."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import time

_PAIR = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|$)")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$")
_UNIT_MIB = {"K": 1.0 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_node(text):
    """One line of C(scontrol show node --oneliner) to a dict (values may contain spaces, e.g. Reason)."""
    return {k: v.strip() for k, v in _PAIR.findall(text.strip())}


def parse_nodes(text):
    """C(scontrol show node --oneliner) of every node: a list of dicts. "No nodes in the system" is []."""
    return [parse_node(line) for line in text.splitlines() if line.startswith("NodeName=")]


def memory_mib(text):
    """squeue's %m (C(0), C(2000M), C(4G)) in MiB; 0 when unset or unreadable."""
    match = _SIZE.match((text or "").strip().upper())
    if not match:
        return 0
    return int(float(match.group(1)) * _UNIT_MIB[match.group(2)])


def slurm_time(text):
    """A Slurm timestamp (local time, C(2026-11-23T09:00:00)) as epoch seconds; None for Unknown/None/empty."""
    try:
        return time.mktime(time.strptime((text or "").strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
