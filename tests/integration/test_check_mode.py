"""kubernetes.core's check mode against the simulator: the write is sent with dryRun=All
and answered, nothing changes (the playbooks' check mode is tested truthfully)."""

import subprocess
import sys

import yaml

from conftest import ADMIN_TOKEN, REPO, ansible_env

MACHINE = "hpc-compute-7d9f8-abcde"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Put the hook on the Machine
      kubernetes.core.k8s:
        kubeconfig: "{{ kubeconfig }}"
        api_version: cluster.x-k8s.io/v1beta2
        kind: Machine
        namespace: metal3
        name: %s
        state: patched
        definition:
          metadata:
            annotations:
              %s: converged-hpc
      register: hold
    - name: Show the result
      ansible.builtin.debug:
        msg: "HOLD {{ hold.changed }} {{ hold.result.metadata.annotations | to_json }}"
""" % (MACHINE, HOOK)


def run(sim, tmp_path, *args):
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "sim",
                  "clusters": [{"name": "sim", "cluster": {"server": sim.url}}],
                  "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
                  "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "admin"}}]}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    (tmp_path / "play.yml").write_text(PLAY)
    return subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
                           "-e", "kubeconfig=%s" % (tmp_path / "kubeconfig"),
                           "-e", "ansible_python_interpreter=" + sys.executable] + list(args),
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, check=False)


def annotations(sim):
    store = sim.store
    return store.get(store.resource("cluster.x-k8s.io", "machines"), "metal3", MACHINE)["metadata"].get(
        "annotations") or {}


def test_check_mode_sends_a_server_side_dry_run_and_changes_nothing(sim, tmp_path):
    before = annotations(sim)
    assert HOOK not in before
    proc = run(sim, tmp_path, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if "HOLD " in ln][0]
    assert "HOLD True" in line and HOOK in line  # the answer shows the change the write would make
    assert annotations(sim) == before  # and nothing was stored
    patches = [q for method, path, q in sim.requests if method == "PATCH" and path.endswith("/" + MACHINE)]
    assert patches and all(q.get("dryRun") == "All" for q in patches), patches
    # without --check the same play stores it
    proc = run(sim, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert annotations(sim)[HOOK] == "converged-hpc"
