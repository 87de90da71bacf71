# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_upgrade_check
short_description: Decide, before anything changes, whether a converge may start the Slurm it finds installed
version_added: 0.6.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Takes what M(converged.hpc.slurm_versions) read on every Slurm host, with each host's roles
    (C(controller), C(compute), C(login), C(slurmdbd)), and returns what a converge must refuse, each naming
    the hosts, the two releases and the ways out. A converge starts (or restarts) each daemon on the version
    installed on its host; it must never start one that cannot take over what runs now.
  - The cluster's Slurm now is the release of every daemon that runs, and of the controllers' saved state.
    A release takes over the state and the RPCs of the two releases before it, of the three from 24.11 (24.11
    from 23.02, 23.11 and 24.05; 26.05 from 24.11, 25.05 and 25.11); a daemon whose installed release is further ahead of any of those is
    refused (22.05 to 24.11 in place loses the queued jobs and the saved state). The ways out - step through
    supported releases, or drain the queue and set O(allow_state_loss).
  - The order of an upgrade - slurmdbd first, then slurmctld, then slurmd and the client commands. A slurmctld
    newer than slurmdbd, a slurmd or client newer than the controllers, or one too old for them, is refused;
    so are controllers of different releases.
  - A slurmdbd about to restart into a newer release needs the accounting database backed up first
    (C(playbooks/accounting_backup.yml)), no longer than O(backup_max_age) seconds before.
  - Slurm does not go back - a slurmctld older than the state saved by a newer one, or than a newer slurmctld
    that runs, and a slurmdbd older than the one that converted the database, are refused, naming the way
    through (the newer release installed again, or the database restored from the dump taken before).
  - Every refusal names the step an upgrade is at - 1 slurmdbd, 2 the controllers (with HA,
    C(playbooks/upgrade_controllers.yml)), 3 the compute nodes (C(playbooks/rollout.yml)), 4 the login nodes.
options:
  _input:
    description: "A list of C({host, roles, versions}), versions being the module's result."
    type: list
    elements: dict
    required: true
  allow_state_loss:
    description: Start a release that cannot take over the running one, once no job runs anywhere.
    type: bool
    default: false
  backup_max_age:
    description: Seconds an accounting dump stays recent enough for a slurmdbd upgrade.
    type: int
    default: 86400
  handover:
    description:
      - The controllers in SlurmctldHost order, when the converge is C(playbooks/upgrade_controllers.yml)'s - the
        standbys given the newer release may start it next to the older one that holds control, which the playbook
        then stops and hands control from (filter C(converged.hpc.slurm_controller_handover) says which). Empty - two
        controller releases are refused.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
check: "{{ hosts | converged.hpc.slurm_upgrade_check(allow_state_loss=false) }}"
"""

RETURN = r"""
_value:
  description: C(errors) (what to refuse, each one line), C(notes) (what was allowed and why), C(now) (the releases
    that run, by host and daemon), C(target) (what the converge would run), C(handover) (with O(handover), the
    plan of filter C(converged.hpc.slurm_controller_handover); else null) and C(step) (where an upgrade is -
    C(from), C(to), C(number) 1-4 or 0 with no upgrade under way, C(name), C(pending) the hosts still behind,
    C(text) one line that says it).
  type: dict
"""

from ansible_collections.converged.hpc.plugins.module_utils.slurm_release import (
    RELEASES,
    oldest_supported,
    ordinal,
    release_of,
    steps,
    takes_over,
)

# the daemon each role runs, and the program whose version the client commands are
DAEMON_OF = {"controller": "slurmctld", "compute": "slurmd", "slurmdbd": "slurmdbd", "login": "client"}


# an upgrade's steps, in Slurm's order: the roles each takes and what it is called
STEPS = [("slurmdbd", ("slurmdbd",), "slurmdbd"), ("controllers", ("controller",), "the controllers"),
         ("compute", ("compute",), "the compute nodes"), ("login", ("login",), "the login nodes")]


def upgrade_step(hosts):
    """Where an upgrade is: the oldest release that runs (or, for a daemon not running, is installed), the
    newest installed, and the first step, in Slurm's order, whose hosts are not all on the newest."""
    at = {}  # (host, role) -> the release it runs, else the one installed
    for entry in hosts:
        v = entry.get("versions") or {}
        installed, running = v.get("installed") or {}, v.get("running") or {}
        for role in entry.get("roles") or []:
            daemon = DAEMON_OF.get(role)
            version = (running.get(daemon) if daemon != "client" else None) or installed.get(daemon)
            if daemon and version:
                at[(entry["host"], role)] = release_of(version)
    newest = [release_of((e.get("versions") or {}).get("installed", {}).get(DAEMON_OF[r]))
              for e in hosts for r in e.get("roles") or [] if r in DAEMON_OF]
    newest = [r for r in newest if r]
    if not at or not newest:
        return dict(number=0, name="", pending=[], text="")
    to = max(newest, key=ordinal)
    older = sorted(set(r for r in at.values() if ordinal(r) < ordinal(to)), key=ordinal)
    if not older:
        return dict(number=0, name="", pending=[], text="", to=to)
    for number, (name, roles, words) in enumerate(STEPS, 1):
        pending = sorted(set("%s (%s)" % (h, r_) for (h, role), r_ in at.items() if role in roles
                             and ordinal(r_) < ordinal(to)))
        if pending:
            step = dict(number=number, name=name, pending=pending, to=to)
            step["from"] = older[0]
            step["text"] = "the upgrade %s -> %s is at step %d of %d, %s (behind: %s)" % (
                older[0], to, number, len(STEPS), words, ", ".join(pending))
            return step
    return dict(number=0, name="", pending=[], text="", to=to)


def _slurmctld(entry, which):
    return release_of(((entry.get("versions") or {}).get(which) or {}).get("slurmctld"))


def slurm_controller_handover(hosts, order):
    """The controllers' step of an upgrade with HA: which controllers have the newer release installed (the standbys
    a site reinstalled or upgraded), which still have the older one, and whether control may be handed from the
    older to the first newer one (every older slurmctld stopped first: an older slurmctld cannot read the newer
    one's messages, so a takeover while it runs would leave two controllers in control)."""
    by_host = dict((e["host"], e) for e in hosts)
    ctls = [h for h in order if h in by_host]
    out = {"errors": [], "new": [], "old": [], "target": "", "to": None, "from": None, "done": False, "text": ""}
    installed = dict((h, _slurmctld(by_host[h], "installed")) for h in ctls)
    missing = [h for h in ctls if not installed[h]]
    if missing:
        out["errors"].append("slurmctld is not installed on %s: every controller needs Slurm installed before a "
                             "handover" % ", ".join(missing))
        return out
    if not ctls:
        out["errors"].append("no controller to hand control over between")
        return out
    to = max(installed.values(), key=ordinal)
    new = [h for h in ctls if installed[h] == to]
    old = [h for h in ctls if installed[h] != to]
    out.update(to=to, new=new, old=old)
    if not old:
        out["done"] = True
        out["text"] = ("every controller has Slurm %s installed (%s): nothing to hand over; site.yml converges them"
                       % (to, ", ".join(ctls)))
        return out
    frm = min((installed[h] for h in old), key=ordinal)
    out["from"] = frm
    if ctls[0] in new:
        out["errors"].append(
            "%s (the primary, SlurmctldHost[0]) has Slurm %s while %s ha%s %s: a primary that starts asks the "
            "controller in control to hand over by messages an older slurmctld cannot read, so it would not let go. "
            "The primary goes last: install Slurm %s back on %s (or leave it stopped), give Slurm %s to a standby "
            "(%s) and run this again" % (ctls[0], to, ", ".join(old), "s" if len(old) == 1 else "ve", frm, frm,
                                         ctls[0], to, ", ".join(h for h in ctls[1:] if h in old) or "none left"))
    if not takes_over(to, frm):
        out["errors"].append("slurmctld %s cannot take over the state of slurmctld %s (%s): Slurm %s reads state "
                             "from %s and later only; step through %s" % (
                                 to, frm, ", ".join(old), to, oldest_supported(to),
                                 " -> ".join([frm] + steps(frm, to) + [to])))
    for entry in hosts:
        if "slurmdbd" not in (entry.get("roles") or []):
            continue
        v = entry.get("versions") or {}
        dbd = release_of((v.get("running") or {}).get("slurmdbd") or (v.get("installed") or {}).get("slurmdbd"))
        if dbd and ordinal(dbd) < ordinal(to):
            out["errors"].append("slurmdbd on %s is Slurm %s: slurmdbd goes first (step 1: "
                                 "playbooks/accounting_backup.yml, Slurm %s on its host, site.yml), then the "
                                 "controllers" % (entry["host"], dbd, to))
    out["target"] = new[0]
    out["text"] = "control handed from %s (Slurm %s) to %s (Slurm %s)" % (", ".join(old), frm, new[0], to)
    return out


def _hosts(pairs):
    return ", ".join(sorted("%s (%s)" % pair if pair[1] else pair[0] for pair in pairs))


def slurm_upgrade_check(hosts, allow_state_loss=False, backup_max_age=86400, handover=None):
    errors, notes = [], []
    now = []      # (release, host, what): the Slurm that runs, or the state that waits
    target = []   # (release, host, daemon): what the converge would start
    steps_running = 0
    dbd_now, dbd_backup = {}, {}
    for entry in hosts:
        host, roles, v = entry["host"], entry.get("roles") or [], entry.get("versions") or {}
        installed, running = v.get("installed") or {}, v.get("running") or {}
        steps_running += int(v.get("job_steps") or 0)
        for daemon, version in sorted(running.items()):
            if version:
                now.append((release_of(version), host, daemon))
        state = (v.get("state") or {}).get("release")
        if state:
            now.append((state, host, "saved state"))
        for role in roles:
            daemon = DAEMON_OF.get(role)
            version = installed.get(daemon)
            if daemon and version:
                target.append((release_of(version), host, "client commands" if daemon == "client" else daemon))
        if "slurmdbd" in roles:
            dbd_now[host] = release_of(running.get("slurmdbd")) if running.get("slurmdbd") else None
            dbd_backup[host] = v.get("backup_age")

    # 1. nothing starts that cannot take over what runs now: slurmctld every daemon that runs and the saved
    # state, slurmdbd the slurmdbd and slurmctld that run, slurmd the job steps of the slurmd it replaces
    def concerns(daemon, host, what, where):
        if daemon == "slurmctld":
            return True
        if daemon == "slurmdbd":
            return what in ("slurmdbd", "slurmctld")
        return daemon == "slurmd" and what == "slurmd" and where == host

    for rel, host, daemon in sorted(target, key=lambda t: (ordinal(t[0]), t[1])):
        behind = [(r, h, d) for r, h, d in now if concerns(daemon, host, d, h)
                  and ordinal(r) < ordinal(rel) and not takes_over(rel, r)]
        if not behind:
            continue
        older = min((r for r, _h, _d in behind), key=ordinal)
        where = _hosts((h, "%s %s" % (d, r)) for r, h, d in behind)
        if allow_state_loss and steps_running == 0:
            notes.append("%s %s on %s starts over Slurm %s (%s): allowed (allow_state_loss, no job running); "
                         "the saved state and the queue are not carried over" % (daemon, rel, host, older, where))
            continue
        path = steps(older, rel)
        errors.append(
            "%s %s on %s cannot take over the Slurm %s that runs now (%s): Slurm %s reads state and RPCs from %s "
            "and later only, so starting it would lose the queued jobs and the saved state%s. Nothing was changed. "
            "Either step through supported releases (%s), or drain the queue (no job pending or running) and set "
            "converged_slurm_allow_state_loss=true"
            % (daemon, rel, host, older, where, rel, oldest_supported(rel),
               " and the %d job step(s) running" % steps_running if steps_running else "",
               " -> ".join([older] + path + [rel])))

    # 1b. Slurm does not go back: a slurmctld older than a newer slurmctld's state, a slurmdbd older than the
    # slurmdbd that converted the database
    for rel, host, daemon in sorted(target, key=lambda t: (ordinal(t[0]), t[1])):
        if daemon not in ("slurmctld", "slurmdbd"):
            continue
        ahead = [(r, h, d) for r, h, d in now if ordinal(r) > ordinal(rel)
                 and (d in ("slurmctld", "saved state") if daemon == "slurmctld" else (d == "slurmdbd" and h == host))]
        if not ahead:
            continue
        newer = max((r for r, _h, _d in ahead), key=ordinal)
        way = ("install Slurm %s again on %s (its packages or its host's image); Slurm %s cannot read the state a "
               "newer slurmctld saved" % (newer, host, rel)) if daemon == "slurmctld" else (
            "install Slurm %s again on %s, or restore the accounting database from the dump taken before its "
            "upgrade (playbooks/accounting_backup.yml keeps it) and then start Slurm %s" % (newer, host, rel))
        errors.append("%s %s on %s would go back from the Slurm %s that runs now (%s): Slurm does not downgrade. "
                      "Nothing was changed. The way through: %s"
                      % (daemon, rel, host, newer, _hosts((h, "%s %s" % (d, r)) for r, h, d in ahead), way))

    # 2. the order: slurmdbd >= slurmctld >= slurmd and the clients, each within the reach of the one above
    by = {}
    for rel, host, daemon in target:
        by.setdefault(daemon, []).append((rel, host))
    ctlds = sorted(set(r for r, _h in by.get("slurmctld", [])), key=ordinal)
    plan = slurm_controller_handover(hosts, handover) if handover else None
    if len(ctlds) > 1 and plan:
        errors.extend(plan["errors"])
        if not plan["errors"]:
            notes.append("%s start%s slurmctld %s as standby next to slurmctld %s on %s, for the handover "
                         "(playbooks/upgrade_controllers.yml)" % (", ".join(plan["new"]), "s" if len(plan["new"]) == 1
                                                                  else "", plan["to"], plan["from"],
                                                                  ", ".join(plan["old"])))
    elif len(ctlds) > 1:
        errors.append("the controllers would run different Slurm releases (%s): they share one state, every "
                      "controller must run the same release; with HA, playbooks/upgrade_controllers.yml starts the "
                      "newer one on the standbys that have it and hands control to it"
                      % _hosts((h, "slurmctld %s" % r) for r, h in by["slurmctld"]))
    ctld = ctlds[-1] if ctlds else None
    for rel, host in by.get("slurmdbd", []):
        if ctld and ordinal(ctld) > ordinal(rel):
            errors.append("slurmctld %s would report to slurmdbd %s on %s: slurmdbd is upgraded first, then the "
                          "controllers (after playbooks/accounting_backup.yml)" % (ctld, rel, host))
    for daemon in ("slurmd", "client commands"):
        for rel, host in by.get(daemon, []):
            if not ctld:
                continue
            if ordinal(rel) > ordinal(ctld):
                errors.append("%s %s on %s is newer than the controllers' slurmctld %s: the controllers are "
                              "upgraded first, then slurmd and the client commands" % (daemon, rel, host, ctld))
            elif not takes_over(ctld, rel):
                errors.append("%s %s on %s is too old for the controllers' slurmctld %s, which talks to %s and "
                              "later only: upgrade it first" % (daemon, rel, host, ctld, oldest_supported(ctld)))

    # 3. a slurmdbd about to restart into a newer release: the database backed up first
    for rel, host in by.get("slurmdbd", []):
        was = dbd_now.get(host)
        if was and ordinal(rel) > ordinal(was):
            age = dbd_backup.get(host)
            if age is None or age > backup_max_age:
                errors.append(
                    "slurmdbd on %s would restart from %s into %s, which converts the accounting database: back it "
                    "up first with playbooks/accounting_backup.yml (%s)"
                    % (host, was, rel, "no dump found" if age is None else "the newest dump is %d h old, more than "
                       "%d h" % (age // 3600, backup_max_age // 3600)))
    step = upgrade_step(hosts)
    if step["number"] and errors:
        errors = ["%s; %s" % (error, step["text"]) for error in errors]
    return dict(errors=errors, notes=notes, step=step, handover=plan,
                now=sorted("%s %s %s" % (h, d, r) for r, h, d in now),
                target=sorted("%s %s %s" % (h, d, r) for r, h, d in target))


def slurm_releases_taken_by(version):
    """The releases a slurmctld of version (or release) takes nodes of: itself and those within its reach."""
    release = release_of(version)
    if not release:
        return []
    return [r for r in RELEASES if ordinal(r) <= ordinal(release) and takes_over(release, r)] + \
        ([release] if release not in RELEASES else [])


class FilterModule(object):
    def filters(self):
        return {"slurm_upgrade_check": slurm_upgrade_check, "slurm_releases_taken_by": slurm_releases_taken_by,
                "slurm_controller_handover": slurm_controller_handover}
