"""converged.hpc.converge_digest: what is an input of a converge and what is not, and (through a real
ansible-playbook) that the run's own options leave the digest alone while any variable moves it."""

import os
import re
import subprocess

from conftest import REPO, ansible_env

from ansible_collections.converged.hpc.plugins.lookup import converge_digest as cd

HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"


def test_host_inputs_drop_the_runs_own_keys_facts_and_deletion_hooks():
    raw = {
        "ansible_host": "10.0.0.5", "slurm_compute_gres": "gpu:2", "omit": "__omit_place_holder__1234",
        "ansible_check_mode": True, "ansible_play_hosts": ["a"], "ansible_run_tags": ["all"],
        "awx_job_id": 41, "tower_job_id": 41, "awx_webhook_payload": {"a": 1}, "ansible_eda": {"event": {}},
        "ansible_facts": {"hostname": "cn1", "date_time": {"epoch": "1"}}, "ansible_hostname": "cn1",
        "capi": {"name": "cn1", "annotations": {HOOK: "converged-hpc", "slurm.converged.hpc/gres": "gpu:2",
                                                "pre-drain.delete.hook.machine.cluster.x-k8s.io/other": "x"}},
    }
    assert cd.host_inputs(raw) == {
        "ansible_host": "10.0.0.5", "slurm_compute_gres": "gpu:2",
        "capi": {"name": "cn1", "annotations": {"slurm.converged.hpc/gres": "gpu:2"}}}


def test_the_digest_follows_values_and_groups_not_order_or_a_runs_own_groups():
    hosts = {"a": {"x": 1, "y": [1, 2]}, "b": {}}
    groups = {"all": ["a", "b"], "compute": ["a"]}
    one = cd.inputs_digest(hosts, groups, "2.19.1", ["t"])
    assert one == cd.inputs_digest({"b": {}, "a": {"y": [1, 2], "x": 1}}, dict(groups, converged_new=["a"]),
                                   "2.19.1", ["t"])
    assert one != cd.inputs_digest({"a": {"x": 2, "y": [1, 2]}, "b": {}}, groups, "2.19.1", ["t"])
    assert one != cd.inputs_digest(hosts, {"all": ["a", "b"], "compute": ["a", "b"]}, "2.19.1", ["t"])
    assert one != cd.inputs_digest(hosts, groups, "2.19.2", ["t"])
    assert one != cd.inputs_digest(hosts, groups, "2.19.1", ["u"])


def test_the_files_digest_follows_content_and_names_not_caches(tmp_path):
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    main = tmp_path / "roles" / "r" / "tasks" / "main.yml"
    main.write_text("- name: a\n")
    top = str(tmp_path / "roles")
    one = cd._files_digest(top)
    (tmp_path / "roles" / "__pycache__").mkdir()
    (tmp_path / "roles" / "__pycache__" / "x.pyc").write_text("cache")
    (tmp_path / "roles" / "r" / "x.retry").write_text("retry")
    assert cd._files_digest(top) == one
    main.write_text("- name: b\n")
    assert cd._files_digest(top) != one
    main.write_text("- name: a\n")
    assert cd._files_digest(top) == one
    main.rename(main.with_name("other.yml"))
    assert cd._files_digest(top) != one


PLAY = """
- name: Print the digest
  hosts: all
  gather_facts: false
  tasks:
    - name: A fact set by an earlier play, as the contract sets them
      ansible.builtin.set_fact:
        contract_fact: "{{ inventory_hostname }}-sorted"
      tags: [always]
    - name: The digest
      ansible.builtin.debug:
        msg: "DIGEST {{ lookup('converged.hpc.converge_digest') }}"
      run_once: true
      tags: [always]
"""


def test_a_real_run_options_do_not_move_the_digest_variables_do(tmp_path):
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("slurm_controller_cluster_name: lab\n")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    cn1: {ansible_connection: local}\n    cn2: {ansible_connection: local}\n"
        "  children:\n    compute: {hosts: {cn1: {}, cn2: {}}}\n")
    play = tmp_path / "play.yml"
    play.write_text(PLAY)

    def digest(*args):
        proc = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "hosts.yml"), str(play)] + list(args),
                              capture_output=True, text=True, env=ansible_env(), cwd=REPO, timeout=120, check=False)
        found = re.findall(r"DIGEST ([0-9a-f]{64})", proc.stdout)
        assert proc.returncode == 0 and found, proc.stdout[-2000:] + proc.stderr[-2000:]
        return found[0]

    base = digest()
    assert digest("--check", "--diff", "-v", "--forks", "3") == base
    assert digest("--tags", "always", "--skip-tags", "never") == base
    assert digest("-e", "converged_skip_unchanged=false") == base
    assert digest("-e", "slurm_controller_cluster_name=other") != base
    (tmp_path / "group_vars" / "all.yml").write_text("slurm_controller_cluster_name: lab\nconverged_nfs: false\n")
    assert digest() != base


def test_the_collection_digest_covers_its_roles_playbooks_and_plugins():
    assert os.path.samefile(cd._COLLECTION, REPO)
    assert len(cd._collection_digest()) == len(cd._TREES) == 4
