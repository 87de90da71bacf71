"""converged.hpc.machine_hook run by ansible-playbook on a real kube-apiserver: on the control node it
runs in Ansible's own process (no Python for modules there), reports changed only when it changed the
Machine, writes nothing in check mode, and names a bad argument before any request."""

import json
import subprocess
import sys

from conftest import ADMIN_TOKEN, CAPI_G, CAPI_V, HOOK, REPO, a_machine, ansible_env

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Act on the hook
      converged.hpc.machine_hook:
        name: cn-1
        namespace: {namespace}
        api_version: cluster.x-k8s.io/v1beta2
        hook: {hook}
        state: {state}
      register: acted
    - name: Say what it did
      ansible.builtin.debug:
        msg: "ACTED {{{{ acted | to_json }}}}"
"""


def play(world, tmp_path, state, hook=HOOK, check=False):
    path = tmp_path / "play.yml"
    path.write_text(PLAY.format(hook=hook, state=state, namespace=world.ns))
    env = ansible_env(**world.auth_env())
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path),
                           "-e", "ansible_python_interpreter=/nonexistent/python3"] + (["--check"] if check else []),
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr
    return proc


def acted(proc):
    line = next(line for line in proc.stdout.splitlines() if '"msg": "ACTED ' in line)
    return json.loads(json.loads("{%s}" % line.strip())["msg"][len("ACTED "):])


def annotations(world):
    return world.api().get(CAPI_G + "/" + CAPI_V, "machines", world.ns, "cn-1")["metadata"].get("annotations") or {}


def test_released_and_put_back_in_ansibles_own_process(world, tmp_path):
    a_machine(world, "cn-1")
    check = play(world, tmp_path, "absent", check=True)
    assert check.returncode == 0 and acted(check)["changed"] is True and HOOK in annotations(world), check.stdout
    released = play(world, tmp_path, "absent")
    assert released.returncode == 0 and acted(released)["changed"] is True, released.stdout[-3000:]
    assert HOOK not in annotations(world) and "changed: [localhost]" in released.stdout
    again = play(world, tmp_path, "absent")
    assert again.returncode == 0 and acted(again)["changed"] is False
    put = play(world, tmp_path, "present")
    assert put.returncode == 0 and acted(put)["changed"] is True and annotations(world)[HOOK] == "converged-hpc"


def test_a_bad_hook_key_fails_naming_it(world, tmp_path):
    a_machine(world, "cn-1")
    proc = play(world, tmp_path, "absent", hook="converged-hpc")
    assert proc.returncode != 0 and "'converged-hpc' is not a Cluster API deletion hook" in proc.stdout, proc.stdout
    assert HOOK in annotations(world)
    proc = play(world, tmp_path, "gone")
    assert proc.returncode != 0 and "state" in proc.stdout and "gone" in proc.stdout, proc.stdout[-2000:]


def test_a_task_environment_reaches_the_module_it_then_runs(world, tmp_path):
    # the credentials only in the task's environment keyword: a module run sees them, this process does not
    a_machine(world, "cn-1")
    path = tmp_path / "env.yml"
    path.write_text(PLAY.format(hook=HOOK, state="absent", namespace=world.ns).replace(
        "      register: acted",
        "      register: acted\n      environment:\n" + "".join("        %s: %s\n" % kv for kv in world.auth_env().items())))
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path),
                           "-e", "ansible_python_interpreter=" + sys.executable], cwd=REPO,
                          env=ansible_env(), capture_output=True, text=True, check=False)
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr
    assert proc.returncode == 0 and acted(proc)["changed"] is True, proc.stdout[-3000:]
    assert HOOK not in annotations(world)
