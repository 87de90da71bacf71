"""kubernetes.core's check mode on a real kube-apiserver: the write is sent as a server-side dry run and
answered, nothing changes (the playbooks' check mode is tested truthfully)."""

import subprocess
import sys

from conftest import ADMIN_TOKEN, CAPI_G, CAPI_V, READONLY_TOKEN, REPO, ansible_env, make_machine

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
        namespace: "{{ namespace }}"
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


def run(world, tmp_path, *args, token=ADMIN_TOKEN):
    kubeconfig = world.kubeconfig(tmp_path / "kubeconfig", token=token)
    (tmp_path / "play.yml").write_text(PLAY)
    return subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(tmp_path / "play.yml"),
                           "-e", "kubeconfig=%s" % kubeconfig, "-e", "namespace=" + world.ns,
                           "-e", "ansible_python_interpreter=" + sys.executable] + list(args),
                          cwd=REPO, env=ansible_env(), capture_output=True, text=True, check=False)


def annotations(world):
    return world.api().get(CAPI_G + "/" + CAPI_V, "machines", world.ns, MACHINE)["metadata"].get("annotations") or {}


def test_check_mode_sends_a_server_side_dry_run_and_changes_nothing(world, tmp_path):
    make_machine(world.api(), world.ns, MACHINE, hooked=False)
    before = annotations(world)
    assert HOOK not in before
    # sent, not skipped: a token that may not patch Machines is refused even in check mode
    proc = run(world, tmp_path, "--check", token=READONLY_TOKEN)
    assert proc.returncode != 0 and "Forbidden" in proc.stdout, proc.stdout[-2000:]
    proc = run(world, tmp_path, "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if "HOLD " in ln][0]
    assert "HOLD True" in line and HOOK in line  # the answer shows the change the write would make
    assert annotations(world) == before  # and nothing was stored: the server's dry run answered
    # without --check the same play stores it
    proc = run(world, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert annotations(world)[HOOK] == "converged-hpc"
