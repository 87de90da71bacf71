"""Every host's facts are its own, on the test bed's ansible-core and on the newest (2.21, on a Python 3.12+
control node: tests/ansible_core.sh). ansible-core 2.21 hands the facts of a task run once to every host that
has none yet as one shared mapping, and a later setup on one of them then shows on all (ansible/ansible#87148):
a converge rendered slurmdbd.conf with DbdHost of a compute node. The collection's contract play gives every
host facts of its own first, and playbooks/tasks/facts_check.yml stops a run whose hosts' facts are one
gathering. Three hosts on this machine (local connection), each with an interpreter path of its own, so that
each host's facts name something only it has."""

import os
import re
import subprocess

import pytest

from conftest import REPO, ansible_env
from labkit import ansible_core_path

GATHER = """
- name: Gather facts
  hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.setup:
        gather_subset: [min]
    - ansible.builtin.import_tasks: %(repo)s/playbooks/tasks/facts_check.yml
    - ansible.builtin.debug:
        msg: "FACTS {{ inventory_hostname }} {{ ansible_facts.python.executable }}"
"""

# the collection's contract first, as every playbook of the collection runs it
WITH_CONTRACT = "- ansible.builtin.import_playbook: %(repo)s/playbooks/contract.yml\n" + GATHER

# a play of a site's own with a task run once, and no workaround
RUN_ONCE_FIRST = """
- name: A task run once
  hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.set_fact:
        once: true
      run_once: true
""" + GATHER

CORES = ["test bed", "2.21"]


def core_env(core):
    env = ansible_env()
    if core != "test bed":
        env["PATH"] = ansible_core_path(core)
    return env


def play(tmp_path, core, text, clusters=None, extra=()):
    """Runs text over three hosts (h1 controller, h2 and h3 compute) of a static inventory, or with clusters
    ({host: (cluster, node type)}) over those hosts as the Cluster API inventory describes them."""
    env = core_env(core)
    python = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env, capture_output=True,
                            text=True, check=True).stdout.strip()
    lines = {"controller": ["h1"], "compute": ["h2", "h3"]}
    if clusters:
        lines = {"all": sorted(clusters)}
    inventory = []
    for group, hosts in lines.items():
        inventory.append("[%s]" % group)
        for host in hosts:
            link = tmp_path / ("python-" + host)
            if not link.exists():
                os.symlink(python, link)
            capi = ""
            if clusters:
                capi = " capi=\"{'cluster': '%s', 'node_type': '%s', 'name': '%s'}\"" % (clusters[host] + (host,))
            inventory.append("%s ansible_connection=local ansible_python_interpreter=%s%s" % (host, link, capi))
    (tmp_path / "inventory.ini").write_text("\n".join(inventory) + "\n")
    (tmp_path / "play.yml").write_text(text % {"repo": REPO})
    proc = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.ini"), str(tmp_path / "play.yml")]
                          + list(extra), cwd=REPO, env=env, capture_output=True, text=True, check=False)
    version = subprocess.run(["ansible", "--version"], env=env, capture_output=True, text=True,
                             check=False).stdout.splitlines()[0]
    return proc, version, tmp_path


def facts_seen(out):
    return sorted(line.split("FACTS ", 1)[1].strip('" ') for line in out.splitlines() if '"msg": "FACTS ' in line)


@pytest.mark.parametrize("core", CORES)
def test_each_host_gathers_its_own_facts_after_the_contract(tmp_path, core):
    proc, version, where = play(tmp_path, core, WITH_CONTRACT)
    assert proc.returncode == 0, version + "\n" + proc.stdout[-3000:] + proc.stderr[-2000:]
    assert facts_seen(proc.stdout) == ["%s %s/python-%s" % (h, where, h) for h in ("h1", "h2", "h3")], \
        version + "\n" + proc.stdout[-3000:]


def test_the_check_stops_a_run_whose_hosts_share_one_hosts_facts(tmp_path):
    # ansible-core 2.21.5 has the fault: with a task run once first and nothing done about it, the three hosts'
    # facts are one host's, and the check says so before anything would change
    proc, version, where = play(tmp_path, "2.21", RUN_ONCE_FIRST)
    if proc.returncode == 0 and facts_seen(proc.stdout) == ["%s %s/python-%s" % (h, where, h) for h in ("h1", "h2", "h3")]:
        pytest.skip("%s keeps the hosts' facts apart: no fault for the check to find" % version)
    assert proc.returncode != 0, version + "\n" + proc.stdout[-3000:]
    assert "the facts of h1, h2, h3 are one gathering" in proc.stdout, version + "\n" + proc.stdout[-3000:]
    assert "FACTS" not in proc.stdout


def test_the_check_passes_where_the_core_keeps_facts_apart(tmp_path):
    proc, version, where = play(tmp_path, "test bed", RUN_ONCE_FIRST)
    assert proc.returncode == 0, version + "\n" + proc.stdout[-3000:]
    assert facts_seen(proc.stdout) == ["%s %s/python-%s" % (h, where, h) for h in ("h1", "h2", "h3")]


@pytest.mark.parametrize("core", CORES)
def test_another_clusters_hosts_get_no_task(tmp_path, core):
    # two clusters in one inventory, the run converging one (converged_cluster=b): the other's hosts get no
    # task of the contract play (tests/e2e/test_two_clusters.py's promise), and b's hosts their own facts
    clusters = {"a1": ("a", "controller"), "a2": ("a", "compute"), "h1": ("b", "controller"),
                "h2": ("b", "compute"), "h3": ("b", "compute")}
    text = WITH_CONTRACT.replace("hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.setup",
                                 "hosts: converged_slurm\n  gather_facts: false\n  tasks:\n    - ansible.builtin.setup")
    assert text != WITH_CONTRACT
    proc, version, where = play(tmp_path, core, text, clusters, ["-e", "converged_cluster=b"])
    assert proc.returncode == 0, version + "\n" + proc.stdout[-3000:] + proc.stderr[-2000:]
    for host in ("a1", "a2"):
        assert not re.search(r"^(ok|changed|fatal): \[%s\]" % host, proc.stdout, re.M), proc.stdout[-3000:]
    assert facts_seen(proc.stdout) == ["%s %s/python-%s" % (h, where, h) for h in ("h1", "h2", "h3")], \
        version + "\n" + proc.stdout[-3000:]
