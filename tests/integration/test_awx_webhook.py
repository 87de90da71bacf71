"""converged.hpc.awx_webhook through ansible-playbook against AWX's webhook receivers (tests/awx_receiver.py):
GitHub-signed and GitLab-token deliveries start one job each, a repeated delivery starts none, a wrong
key is refused with a line that names the cause and never the key, check mode sends nothing."""

import json
import subprocess
import sys

import pytest

from awx_receiver import QUEUED, SEEN, Receiver
from conftest import ansible_env

KEYS = {1: "gh-key-Zq81sW0", 2: "gl-key-Pm42xV9"}
PAYLOAD = {"reasons": ["up"], "resourceVersion": "41",
           "machines": [{"namespace": "metal3", "name": "compute-a", "resourceVersion": "41", "reason": "up"}]}

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Send
      converged.hpc.awx_webhook:
        url: "{{ url }}"
        service: "{{ service }}"
        key: "{{ key }}"
        payload: "{{ payload }}"
      register: sent
    - name: Show
      ansible.builtin.debug:
        var: sent
"""


@pytest.fixture
def awx():
    receiver = Receiver({1: {"service": "github", "key": KEYS[1]}, 2: {"service": "gitlab", "key": KEYS[2]}})
    yield receiver
    receiver.stop()


def send(tmp_path, url, service, key, payload, *args):
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "vars.json").write_text(json.dumps({"url": url, "service": service, "key": key, "payload": payload}))
    return subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", "-e", "@%s" % (tmp_path / "vars.json"),
                           "-e", "ansible_python_interpreter=%s" % sys.executable, "-v", *args,
                           str(tmp_path / "play.yml")], env=ansible_env(), capture_output=True, text=True, check=False)


@pytest.mark.parametrize("template", [1, 2])
def test_a_delivery_starts_one_job_and_a_repeat_none(tmp_path, awx, template):
    service = awx.templates[template]["service"]
    res = send(tmp_path, awx.webhook_url(template), service, KEYS[template], PAYLOAD)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "changed=1" in res.stdout and QUEUED in res.stdout
    assert len(awx.jobs) == 1
    (got_template, extra_vars), = awx.jobs
    assert got_template == template
    assert extra_vars["awx_webhook_payload"] == PAYLOAD  # the body reaches the job as the hint
    assert extra_vars["awx_webhook_event_type"] == "converged-hpc-machines"
    res = send(tmp_path, awx.webhook_url(template), service, KEYS[template], PAYLOAD)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "changed=0" in res.stdout and SEEN in res.stdout
    assert len(awx.jobs) == 1  # the same payload is the same delivery: no second job
    newer = dict(PAYLOAD, resourceVersion="42")
    res = send(tmp_path, awx.webhook_url(template), service, KEYS[template], newer)
    assert res.returncode == 0 and len(awx.jobs) == 2  # a new event is a new delivery


@pytest.mark.parametrize("template", [1, 2])
def test_a_wrong_key_is_refused_and_never_shown(tmp_path, awx, template):
    service = awx.templates[template]["service"]
    wrong = "not-the-key-Hj7"
    res = send(tmp_path, awx.webhook_url(template), service, wrong, PAYLOAD, "-vvv")
    assert res.returncode != 0
    assert "(403): the key is not this job template's webhook key" in res.stdout
    assert not awx.jobs
    assert wrong not in res.stdout + res.stderr
    assert awx.answers == [(403, "You do not have permission to perform this action.")]


def test_a_url_of_the_other_service_fails_before_sending(tmp_path, awx):
    res = send(tmp_path, awx.webhook_url(1), "gitlab", KEYS[1], PAYLOAD)
    assert res.returncode != 0
    assert "is not a gitlab webhook URL" in res.stdout
    assert not awx.answers


def test_check_mode_sends_nothing(tmp_path, awx):
    res = send(tmp_path, awx.webhook_url(1), "github", KEYS[1], PAYLOAD, "--check")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "would send" in res.stdout
    assert not awx.answers
