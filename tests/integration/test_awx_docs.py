"""docs/awx.md's command lines run as written: the webhook rulebook's (its vars file, its inventory line,
ansible-rulebook) and the curl check of a template's webhook, against AWX's webhook receiver
(tests/awx_receiver.py) and a real kube-apiserver, with only the URL, the key, the kubeconfig path and the
namespace (the test's own) put in.
The control node has several Pythons: the python3 (and python3.X) found first on PATH are not the one
with the collection's dependencies, as on many control nodes."""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from awx_receiver import QUEUED, Receiver
from conftest import ADMIN_TOKEN, COLLECTIONS, REPO, a_machine

DOC = os.path.join(REPO, "docs", "awx.md")
URL = "https://awx.example.org/api/v2/job_templates/12/github/"
KEY = "a-webhook-key-for-the-docs-test"


def blocks():
    with open(DOC) as fh:
        return re.findall(r"```bash\n(.*?)```", fh.read(), re.S)


def block_with(text):
    (found,) = [b for b in blocks() if text in b]
    return found


@pytest.fixture
def decoy_path(tmp_path):
    """A PATH whose first python3 and python3.X are not usable (no collection dependencies here)."""
    bindir = tmp_path / "decoys"
    bindir.mkdir()
    for name in ["python3"] + ["python3.%d" % minor for minor in range(6, 16)]:
        path = bindir / name
        path.write_text("#!/bin/sh\necho 'not the Python with the collection dependencies' >&2\nexit 3\n")
        path.chmod(0o755)
    return str(bindir) + os.pathsep + os.environ["PATH"]


@pytest.fixture
def receiver():
    jobs = Receiver({12: {"service": "github", "key": KEY}})
    yield jobs
    jobs.stop()


def test_the_webhook_rulebook_runs_as_documented(world, receiver, tmp_path, decoy_path):
    a_machine(world, "cn-1")
    kubeconfig = world.kubeconfig(tmp_path / "mgmt", context="mgmt")
    script = block_with("converged.hpc.reconcile_webhook")
    assert "converged_capi_namespaces: [metal3]" in script
    script = script.replace("converged_capi_namespaces: [metal3]", "converged_capi_namespaces: [%s]" % world.ns)
    script = script.replace(URL, receiver.url + "/api/v2/job_templates/12/github/")
    script = script.replace("<the content of converged-hpc-reconcile.key>", KEY).replace("~/.kube/mgmt", kubeconfig)
    assert "ansible_python_interpreter" in script  # the interpreter is named, not discovered
    env = dict(os.environ, PATH=decoy_path, ANSIBLE_COLLECTIONS_PATH=COLLECTIONS,
               ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"))
    for key in [k for k in env if k.startswith("K8S_AUTH_")] + ["KUBECONFIG"]:
        env.pop(key, None)
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=str(tmp_path), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not receiver.jobs and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert receiver.jobs, out[-3000:]
    template, extra_vars = receiver.jobs[0]
    assert template == 12 and [m["name"] for m in extra_vars["awx_webhook_payload"]["machines"]] == ["cn-1"]
    assert receiver.answers[0] == (202, QUEUED)
    assert KEY not in out and ADMIN_TOKEN not in out
    assert oct((tmp_path / "eda-webhook.yml").stat().st_mode & 0o777) == "0o600"


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl")
def test_the_webhook_check_by_hand_runs_as_documented(receiver, tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "converged-hpc").mkdir(parents=True)
    (home / ".config" / "converged-hpc" / "converged-hpc-reconcile.key").write_text(KEY)
    script = block_with("X-Hub-Signature").replace(URL, receiver.url + "/api/v2/job_templates/12/github/")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=str(tmp_path), capture_output=True,
                          text=True, env=dict(os.environ, HOME=str(home)), timeout=60, check=False)
    assert proc.returncode == 0 and QUEUED in proc.stdout, proc.stdout + proc.stderr
    assert len(receiver.jobs) == 1 and receiver.jobs[0][1]["awx_webhook_payload"]["reasons"] == ["manual"]
