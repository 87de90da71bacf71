"""A lab of its own for an end-to-end test module: settings, commands, up and down."""

import os
import re
import subprocess
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for(what, cond, timeout, poll=None, explain=None):
    """cond()'s first true value; fails naming what after timeout seconds, with what explain() returns (the
    state that tells why) when given. Polled every poll seconds when given (a test that times the wait); else
    after 1 s, then each pause half as long again, up to 3 s: most conditions are a `podman exec` (about 0.2 s
    of CPU each), and a long wait polled every second costs the labs running beside it."""
    deadline = time.time() + timeout
    pause = poll or 1.0
    while True:
        value = cond()
        if value:
            return value
        assert time.time() < deadline, "gave up waiting for %s%s" % (what, "\n" + explain() if explain else "")
        time.sleep(min(pause, max(0.1, deadline - time.time())))
        if poll is None:
            pause = min(3.0, pause * 1.5)


def oldest_ansible_core():
    """The oldest ansible-core release the collection claims (meta/runtime.yml's requires_ansible), e.g. "2.16"."""
    with open(os.path.join(REPO, "meta", "runtime.yml")) as fh:
        found = re.search(r"requires_ansible:\s*[\"']?>=\s*(\d+\.\d+)", fh.read())
    assert found, "meta/runtime.yml names no oldest ansible-core (requires_ansible: \">=2.x\")"
    return found.group(1)


def ansible_core_path(version):
    """A PATH whose ansible-playbook is ansible-core version's (tests/ansible_core.sh makes its venv once)."""
    proc = subprocess.run([os.path.join(REPO, "tests", "ansible_core.sh"), version], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, "no venv with ansible-core %s: %s" % (version, proc.stderr[-2000:])
    return proc.stdout.strip() + os.pathsep + os.environ.get("PATH", "")


class Lab:
    def __init__(self, name, subnet_prefix, api_port, state, **settings):
        self.state = os.path.join(REPO, state)
        self.env = dict(os.environ, LAB_NAME=name, LAB_SUBNET_PREFIX=subnet_prefix, LAB_API_PORT=str(api_port),
                        LAB_STATE=state, LAB_FLAVOUR="prebaked", LAB_CONTROLLERS="1",
                        CONTAINERS_CONF=os.path.join(REPO, "lab", "containers.conf"),
                        ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
        self.env.update(settings)

    def sh(self, *cmd, check=True, timeout=900, input_text=None):
        proc = subprocess.run(list(cmd), cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout,
                              input=input_text, check=False)
        if check and proc.returncode != 0:
            raise AssertionError("%s failed (%d):\n%s\n%s" % (" ".join(cmd), proc.returncode,
                                                              proc.stdout[-3000:], proc.stderr[-3000:]))
        return proc

    def on(self, machine, command, check=True):
        return self.sh("podman", "exec", machine, "bash", "-c", command, check=check)

    def ask(self, machine, command, timeout=30, explain=None, accept=None):
        """A status query's output on machine (sinfo, squeue, scontrol show). A busy slurmctld times a client
        out now and then: a query that fails (and whose result accept(result) does not take as an answer) is
        asked again every 2 s for up to timeout seconds before it fails the test, naming the command, its last
        error and what explain() returns (say, the controllers' units). Its stdout."""
        last = []

        def answered():
            last[:] = [self.on(machine, command, check=False)]
            return last[0].returncode == 0 or (accept is not None and accept(last[0]))

        def why():
            res = last[0]
            return "exit %d: %s%s" % (res.returncode, (res.stdout + res.stderr).strip()[-2000:],
                                      "\n" + explain() if explain else "")
        wait_for("%s on %s to answer" % (command, machine), answered, timeout, poll=2, explain=why)
        return last[0].stdout

    def job_state(self, machine, job):
        """A job's JobState as scontrol on machine shows it, or None when Slurm no longer knows it (a controller
        that does not answer is asked again for a minute)."""
        out = self.ask(machine, "scontrol show job %s" % job, timeout=60,
                       accept=lambda res: "Invalid job id" in res.stdout + res.stderr)
        found = re.search(r"JobState=(\S+)", out)
        return found.group(1) if found else None

    def sssd_conf_mode(self, machine):
        """The mode the sssd role gives sssd.conf there: 0640 on Debian 13 (SSSD 2.10's unit gives
        /etc/sssd to its group), 0600 before."""
        major = self.on(machine, ". /etc/os-release; echo $VERSION_ID").stdout.strip().split(".")[0]
        return "640" if int(major) >= 13 else "600"

    def slurm_release(self, machine):
        """The Slurm release a machine has ("24.11" on Debian 13, "22.05" on Debian 12): its slurmd's or
        slurmctld's, which print it without a configuration (the client commands do not, from 23.11)."""
        out = self.on(machine, "if command -v slurmd >/dev/null; then slurmd -V; else slurmctld -V; fi").stdout
        return ".".join(out.split()[-1].split(".")[:2])

    def up(self, converge=True):
        """A fresh lab: machines, the management cluster, then (converge) site.yml and validate.yml, the main job."""
        self.sh("lab/lab.sh", "down")
        self.sh("make", "-s", "dev-collection")
        self.sh("lab/lab.sh", "up")
        self.sh("lab/lab.sh", "directory")
        self.sh("lab/lab.sh", "mgmt")
        if converge:
            self.sh("lab/lab.sh", "converge")

    def down(self):
        if not os.environ.get("KEEP_LAB"):
            self.sh("lab/lab.sh", "down", check=False)

    def playbook_args(self, name, *extra_vars, limit=None):
        """ansible-playbook's command line for playbooks/name through the lab's CAPI inventory."""
        args = ["ansible-playbook", "-i", os.path.join(self.state, "capi.capi_machines.yml"),
                os.path.join("playbooks", name)]
        for ev in extra_vars:
            args += ["-e", ev]
        if limit:
            args += ["--limit", limit]
        return args

    def playbook(self, name, *extra_vars, limit=None):
        return self.sh(*self.playbook_args(name, *extra_vars, limit=limit), check=False)

    def playbook_in_background(self, name, log, *extra_vars):
        """ansible-playbook playbooks/name started in its own process group, its output going to the file log:
        finish_playbook waits for it."""
        with open(log, "w") as out:
            return subprocess.Popen(self.playbook_args(name, *extra_vars), cwd=REPO, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)

    @staticmethod
    def finish_playbook(proc, log, timeout, explain=None):
        """(returncode, output) of a playbook_in_background run; after timeout seconds it is killed (so that it
        cannot act on what comes next) and the failure shows its output so far and what explain() returns."""
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            raise AssertionError("%s still running after %d s, killed; its output so far:\n%s%s" % (
                " ".join(proc.args[:4]), timeout, open(log).read()[-6000:], "\n" + explain() if explain else ""))
        return proc.returncode, open(log).read()


class Poller:
    """A sampler run beside a test's action: sample() called in a thread of its own from the `with` block's start
    to its end, again `interval` seconds after each call returns."""
    interval = 2.0

    def __init__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        raise NotImplementedError

    def _run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(self.interval)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)


def machine_of(co, host, namespace="metal3"):
    """The Machine (a dict) whose host is named host (its Hostname address: CAPM3 copies the host's
    hardware hostname there), or None. Real Cluster API names Machines after their MachineSet, not their
    host: the lab's machines are named after their hosts."""
    items = co.list_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", namespace, "machines")["items"]

    def hostnames(machine):
        return {a["address"] for a in (machine.get("status") or {}).get("addresses") or [] if a["type"] == "Hostname"}
    return next((m for m in items if host in hostnames(m)), None)


def has_podman():
    return subprocess.run(["which", "podman"], capture_output=True, check=False).returncode == 0
