# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm releases and what each can take over from: pure functions, no I/O.

A release is "YY.MM" (the first two numbers of a version, "24.11" of "24.11.5"). SchedMD's rule (each
release's RELEASE_NOTES and the upgrade guide's compatibility window): a release reads the saved state and
the RPCs of the two releases before it, and from 24.11 the three before it (24.05 still two: 23.11 and
23.02; 24.11 takes 24.05, 23.11 and 23.02; 26.05 takes 25.11, 25.05 and 24.11); anything older is lost (queued jobs, saved state) or refused (a
slurmd too old to talk to). slurmdbd is upgraded first, then slurmctld, then slurmd and the clients:
never a daemon newer than the one it reports to.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# every release, in order (from 20.02 to 23.02 about every nine months; from 23.11 two a year: .05 and .11)
RELEASES = ["17.11", "18.08", "19.05", "20.02", "20.11", "21.08", "22.05", "23.02", "23.11", "24.05",
            "24.11", "25.05", "25.11", "26.05"]


def release_of(version):
    """"24.11" of "24.11.5" (or of "slurm 24.11.5"), None for nothing usable."""
    found = re.search(r"(\d+)\.(\d+)", str(version or ""))
    return "%d.%02d" % (int(found.group(1)), int(found.group(2))) if found else None


def ordinal(release):
    """The release's place in the sequence (a later release: a larger number). Releases after the list
    follow its pattern: one in May and one in November of each year."""
    if release in RELEASES:
        return RELEASES.index(release)
    year, month = (int(x) for x in release.split("."))
    last_year, last_month = (int(x) for x in RELEASES[-1].split("."))
    if (year, month) < (last_year, last_month):
        raise ValueError("%s is not a Slurm release" % release)
    return len(RELEASES) - 1 + (year - last_year) * 2 + (1 if month > 5 else 0) - (1 if last_month > 5 else 0)


def window(release):
    """How many releases before it a release takes over from (state and RPCs)."""
    return 3 if ordinal(release) >= ordinal("24.11") else 2


def oldest_supported(release):
    """The oldest release this one takes over from."""
    at = ordinal(release) - window(release)
    return RELEASES[at] if 0 <= at < len(RELEASES) else None


def takes_over(newer, older):
    """Whether a daemon of release newer reads the state and RPCs of release older."""
    return 0 <= ordinal(newer) - ordinal(older) <= window(newer)


def steps(older, newer):
    """The releases a site steps through from older to newer, each within the reach of the next: the
    fewest, the furthest reachable first ([] when newer takes over from older)."""
    path, here = [], older
    while not takes_over(newer, here):
        reach = [r for r in RELEASES if ordinal(here) < ordinal(r) < ordinal(newer) and takes_over(r, here)]
        if not reach:
            break
        here = max(reach, key=ordinal)
        path.append(here)
    return path
