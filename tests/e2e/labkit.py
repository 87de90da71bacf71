"""A lab of its own for an end-to-end test module: settings, commands, up and down."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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

    def up(self, converge=True):
        """A fresh lab: machines, the simulator, then (converge) site.yml and validate.yml, the main job."""
        self.sh("lab/lab.sh", "down")
        self.sh("make", "-s", "dev-collection")
        self.sh("lab/lab.sh", "up")
        self.sh("lab/lab.sh", "directory")
        self.sh("lab/lab.sh", "sim")
        if converge:
            self.sh("lab/lab.sh", "converge")

    def down(self):
        if not os.environ.get("KEEP_LAB"):
            self.sh("lab/lab.sh", "down", check=False)

    def playbook(self, name, *extra_vars, limit=None):
        args = ["ansible-playbook", "-i", os.path.join(self.state, "capi.capi_machines.yml"),
                os.path.join("playbooks", name)]
        for ev in extra_vars:
            args += ["-e", ev]
        if limit:
            args += ["--limit", limit]
        return self.sh(*args, check=False)


def has_podman():
    return subprocess.run(["which", "podman"], capture_output=True, check=False).returncode == 0
