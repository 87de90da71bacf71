"""scale_up.yml under --limit, as AWX runs it for the new hosts: the new Machines are looked for among the
limited compute hosts only, once for the cluster; the run also needs the controllers and localhost in the
limit (the controllers' liveness and the Lease run there), and says so when they are left out; every
lifecycle playbook refuses, before anything runs, a limit without localhost. Slurm's
node list comes from a stand-in `sinfo` on the controller (a local connection); the compute hosts are
unreachable addresses (TEST-NET-1), so nothing is ever converged."""

import os
import subprocess
import sys

import pytest

from conftest import REPO, ansible_env

INVENTORY = """
all:
  vars:
    converged_lease: false
    converged_boot_timeout: 2
    ansible_python_interpreter: {python}
  children:
    controller:
      hosts:
        ctl: {{ansible_connection: local}}
    compute:
      hosts:
        cn1: {{ansible_host: 192.0.2.1, ansible_ssh_common_args: "-o ConnectTimeout=1"}}
        cn2: {{ansible_host: 192.0.2.2, ansible_ssh_common_args: "-o ConnectTimeout=1"}}
        cn3: {{ansible_host: 192.0.2.3, ansible_ssh_common_args: "-o ConnectTimeout=1"}}
"""


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    root = tmp_path_factory.mktemp("limit")
    (root / "bin").mkdir()
    sinfo = root / "bin" / "sinfo"
    sinfo.write_text('#!/bin/sh\nprintf "cn1\\ncn2\\n"\n')  # Slurm knows cn1 and cn2, not cn3
    sinfo.chmod(0o755)
    inventory = root / "inv.yml"
    inventory.write_text(INVENTORY.format(python=sys.executable))
    return root, inventory


def run(bed, playbook, limit):
    root, inventory = bed
    env = ansible_env(PATH="%s:%s" % (root / "bin", os.environ["PATH"]))
    return subprocess.run(["ansible-playbook", "-i", str(inventory), os.path.join(REPO, "playbooks", playbook),
                           "--limit", limit], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def scale_up(bed, limit):
    return run(bed, "scale_up.yml", limit).stdout


@pytest.mark.parametrize("limit, new", [("cn2,converged_controller,localhost", "none"),
                                        ("cn3,converged_controller,localhost", "cn3"),
                                        ("all,localhost", "cn3")])
def test_only_the_limited_compute_hosts_are_looked_at(bed, limit, new):
    out = scale_up(bed, limit)
    assert '"msg": "new to Slurm: %s"' % new in out, out[-3000:]
    if new == "cn3":  # it goes on to converge cn3, which does not answer in its 2 s: nothing is changed anywhere
        assert "fatal: [cn3]: FAILED! => " in out and "timed out waiting for ping module test" in out, out[-3000:]


def test_a_limit_without_the_controllers_says_so(bed):
    out = scale_up(bed, "cn3,localhost")
    assert "no Slurm controller answers (ctl)" in out, out[-3000:]
    assert "\"msg\": \"new to Slurm" not in out


@pytest.mark.parametrize("playbook, limit", [("scale_up.yml", "cn3,converged_controller"), ("scale_up.yml", "all"),
                                             ("scale_down.yml", "cn1"), ("reconcile.yml", "all"),
                                             ("move.yml", "compute:controller"), ("rebalance.yml", "ctl"),
                                             ("autoscale.yml", "!cn1")])
def test_a_limit_without_localhost_is_refused_before_anything_runs(bed, playbook, limit):
    """Ansible would skip the plays on localhost without a word (--limit all too: the implicit localhost is
    not in all): the Lease, the hook, the replicas. The run stops first, naming the limit."""
    proc = run(bed, playbook, limit)
    assert proc.returncode != 0
    assert "--limit %s leaves out localhost" % limit in proc.stdout, proc.stdout[-3000:]
    assert "--limit '%s,localhost'" % limit in proc.stdout
    # the refusal is the run's first task: nothing else ran
    tasks = [line for line in proc.stdout.splitlines() if line.startswith("TASK [")]
    assert len(tasks) == 1 and "Refuse a --limit that leaves out localhost" in tasks[0], tasks
