"""converged.hpc.lease run by ansible-playbook on a real kube-apiserver, the Lease read back from the server: it outlives its duration while the run lives
(the detached renewer), a second run waits for it and names the holder, a killed run's Lease lapses
and the next run takes it, and the token never shows. Each test's Lease is in a namespace of its own."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import ADMIN_TOKEN, REPO, ansible_env

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Take the Lease
      converged.hpc.lease:
        namespace: {namespace}
        duration: {duration}
        timeout: {timeout}
        poll: 0.5
      register: taken
    - name: Say who holds it
      ansible.builtin.debug:
        msg: "TAKEN {{{{ taken | to_json }}}}"
    - name: Hold it a while
      ansible.builtin.pause:
        seconds: {hold}
      when: {hold} > 0
    - name: Give it back
      converged.hpc.lease:
        namespace: {namespace}
        state: released
      when: {release}
"""


def start(world, tmp_path, name, duration=6, timeout=0, hold=0, release=True, check=False):
    path = tmp_path / ("%s.yml" % name)
    path.write_text(PLAY.format(duration=duration, timeout=timeout, hold=hold, release=str(release).lower(),
                                namespace=world.ns))
    env = ansible_env(**dict(world.auth_env(), K8S_AUTH_API_KEY=ADMIN_TOKEN + "\n"))
    return subprocess.Popen(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path),
                             "-e", "ansible_python_interpreter=" + sys.executable] + (["--check"] if check else []),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc, timeout=120):
    out = proc.communicate(timeout=timeout)[0]
    assert ADMIN_TOKEN not in out
    return proc.returncode, out


def taken(out):
    line = next(line for line in out.splitlines() if '"msg": "TAKEN ' in line)
    return json.loads(json.loads("{%s}" % line.strip())["msg"][len("TAKEN "):])


def stored(world):
    return world.api().get("coordination.k8s.io/v1", "leases", world.ns, "converged-hpc")


def holder(world):
    return ((stored(world) or {}).get("spec") or {}).get("holderIdentity")


def wait_for(predicate, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_the_lease_outlives_its_duration_while_the_run_lives(world, tmp_path):
    a = start(world, tmp_path, "a", duration=5, hold=20)
    assert wait_for(lambda: holder(world) is not None)
    time.sleep(7)  # past the duration: only renewals keep it
    held = holder(world)
    assert held is not None
    # (the holder read before b: on a loaded machine a may be done by the time b is)
    rc, out = finish(start(world, tmp_path, "b", timeout=0))
    assert rc != 0 and "is held by %s" % held in out, out
    rc, out = finish(a)
    assert rc == 0, out
    assert "ansible-playbook pid" in taken(out)["holder"] and taken(out)["renewer_pid"] > 0
    assert holder(world) is None  # given back
    assert wait_for(lambda: not os.path.exists("/proc/%d" % taken(out)["renewer_pid"]), 15)


def test_a_second_run_waits_for_the_first(world, tmp_path):
    a = start(world, tmp_path, "a", duration=30, hold=4)
    assert wait_for(lambda: holder(world) is not None)
    first = holder(world)
    rc, out = finish(start(world, tmp_path, "b", timeout=60))
    assert rc == 0, out
    assert taken(out)["waited"] > 0 and taken(out)["previous_holder"] is None  # a gave it back first
    assert finish(a)[0] == 0
    assert taken(out)["holder"] != first


def kill_workers(tmp_path, name):
    """The killed run's workers: in sessions of their own, they outlive it, and one blocked on its dead parent's
    pipe stays for good (seen, after a whole make test)."""
    subprocess.run(["pkill", "-KILL", "-f", str(tmp_path / ("%s.yml" % name))], check=False)


def test_a_killed_run_lapses_and_the_next_takes_over(world, tmp_path):
    # ansible-playbook's workers run in sessions of their own: the one in the pause outlives the
    # kill below (not the run: the renewer follows ansible-playbook itself), for at most the pause
    a = start(world, tmp_path, "a", duration=5, hold=30, release=False)
    assert wait_for(lambda: holder(world) is not None)
    dead = holder(world)
    os.killpg(a.pid, signal.SIGKILL)  # the whole run dies at once, as a killed AWX job
    a.communicate()
    kill_workers(tmp_path, "a")
    started = time.monotonic()
    rc, out = finish(start(world, tmp_path, "b", duration=5, timeout=60))
    assert rc == 0, out
    assert taken(out)["previous_holder"] == dead
    assert time.monotonic() - started < 30  # lapsed after its duration, not the 60 s timeout
    assert holder(world) is None


def test_a_run_dead_but_not_reaped_lapses_too(world, tmp_path):
    # a run that died but whose parent has not collected it yet (a zombie: kill(pid, 0) still answers) must not
    # be renewed: found by the soak, where a run's Lease was renewed for minutes after the run had ended
    a = start(world, tmp_path, "a", duration=5, hold=30, release=False)
    assert wait_for(lambda: holder(world) is not None)
    dead = holder(world)
    os.killpg(a.pid, signal.SIGKILL)
    assert wait_for(lambda: open("/proc/%d/stat" % a.pid).read().rpartition(")")[2].split()[0] == "Z")
    try:
        started = time.monotonic()
        rc, out = finish(start(world, tmp_path, "b", duration=5, timeout=60))
        assert rc == 0, out
        assert taken(out)["previous_holder"] == dead
        assert time.monotonic() - started < 30
    finally:
        a.communicate()  # reaped only now
        kill_workers(tmp_path, "a")


def test_check_mode_takes_nothing(world, tmp_path):
    rc, out = finish(start(world, tmp_path, "a", check=True))
    assert rc == 0, out
    assert holder(world) is None
    assert stored(world) is None


def run_play(world, tmp_path, play, *args):
    path = tmp_path / "play.yml"
    path.write_text(play)
    env = ansible_env(**world.auth_env())
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", str(path)] + list(args), cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr
    return proc


def test_on_the_control_node_the_lease_is_taken_in_ansibles_own_process(world, tmp_path):
    # no Python for modules on localhost: a module run would fail, the action plugin needs none
    play = PLAY.format(duration=30, timeout=0, hold=0, release="true", namespace=world.ns)
    proc = run_play(world, tmp_path, play, "-c", "local", "-e", "ansible_python_interpreter=/nonexistent/python3")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "ansible-playbook pid" in taken(proc.stdout)["holder"] and taken(proc.stdout)["renewer_pid"] > 0
    assert holder(world) is None  # given back


def test_elsewhere_the_module_runs_on_the_task_host(world, tmp_path):
    # a task on another host (not delegated to the control node) is a module run there, as before
    play = PLAY.replace("hosts: localhost", "hosts: elsewhere")
    play = play.format(duration=30, timeout=0, hold=0, release="true", namespace=world.ns)
    path = tmp_path / "hosts.ini"
    path.write_text("elsewhere ansible_host=127.0.0.1 ansible_port=9 ansible_connection=ssh\n")
    proc = run_play(world, tmp_path, play, "-i", str(path))
    assert proc.returncode != 0 and "UNREACHABLE" in proc.stdout, proc.stdout[-3000:]
    assert holder(world) is None


def test_a_bad_argument_is_named_before_the_lease_is_touched(world, tmp_path):
    play = PLAY.format(duration="soon", timeout=0, hold=0, release="true", namespace=world.ns)
    proc = run_play(world, tmp_path, play, "-c", "local")
    assert proc.returncode != 0 and "duration" in proc.stdout and "soon" in proc.stdout, proc.stdout[-3000:]
    assert stored(world) is None
