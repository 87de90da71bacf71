"""playbooks/awx_configure.yml runs against a real AWX, which cannot be installed here. What can be
checked without one is checked: every awx.awx option it uses is one `ansible-doc` documents (with a
literal value among its choices), every task handing over a secret is no_log, every playbook and
inventory file it names exists in the project, the webhook templates are the reconcile and scale
ones, and bad input fails before any AWX call, naming what is missing."""

import functools
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, ansible_env

PLAYBOOK = os.path.join(REPO, "playbooks", "awx_configure.yml")
SECRET_INPUTS = ("kubeconfig", "bearer_token", "ssh_key_data", "munge_key", "ldap_bind_password", "vrrp_password")


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))


def tasks():
    (play,) = yaml.load(open(PLAYBOOK), Loader=_Loader)  # noqa: S506 - a SafeLoader that knows !unsafe
    return play, play["tasks"]


@functools.lru_cache(maxsize=None)
def documented(module):
    out = subprocess.run(["ansible-doc", "-j", module], env=ansible_env(), capture_output=True, text=True,
                         check=True).stdout
    return next(iter(json.loads(out).values()))["doc"]["options"]


def test_every_awx_option_is_documented_and_literal_choices_valid():
    _play, body = tasks()
    used = 0
    for task in body:
        module = next((k for k in task if k.startswith("awx.awx.")), None)
        if not module:
            continue
        used += 1
        options = documented(module)
        for key, value in task[module].items():
            assert key in options, "%s: %s is not an option ansible-doc documents" % (task["name"], key)
            choices = options[key].get("choices")
            if choices and isinstance(value, str) and "{{" not in value:
                assert value in choices, "%s: %s=%r not in %s" % (task["name"], key, value, choices)
    assert used >= 10


def test_secrets_pass_only_in_no_log_tasks():
    _play, body = tasks()
    for task in body:
        text = yaml.safe_dump({k: v for k, v in task.items() if k != "name"})
        if any(re.search(r"\b%s:" % name, text) for name in SECRET_INPUTS) and "awx.awx.credential_type" not in task:
            assert task.get("no_log") is True, task["name"]
        if "webhook_key" in text:
            assert task.get("no_log") is True, task["name"]


def test_the_templates_run_playbooks_of_this_project_and_webhooks_launch_the_scale_and_reconcile_ones():
    play, body = tasks()
    templates = play["vars"]["awx_templates"]
    for template in templates:
        assert os.path.isfile(os.path.join(REPO, template["playbook"])), template
    assert {t["name"] for t in templates if t["webhook"]} == {"reconcile", "scale-up", "scale-down"}
    assert {t["name"] for t in templates} >= {"site", "validate", "controller-takeover", "autoscale"}
    (source,) = [t["awx.awx.inventory_source"] for t in body if "awx.awx.inventory_source" in t]
    assert os.path.isfile(os.path.join(REPO, source["source_path"]))
    (jobs,) = [t["awx.awx.job_template"] for t in body if "awx.awx.job_template" in t]
    assert jobs["allow_simultaneous"] is False


def test_the_project_finds_the_collection_in_the_execution_environment():
    # AWX runs the project's ansible.cfg: its collections_path must still reach the EE's collections
    cfg = open(os.path.join(REPO, "ansible.cfg")).read()
    (paths,) = re.findall(r"^collections_path\s*=\s*(.+)$", cfg, re.M)
    assert "/usr/share/ansible/collections" in paths.split(":")


def test_missing_input_fails_before_any_awx_call():
    env = ansible_env(CONTROLLER_HOST="https://awx.invalid")
    res = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", PLAYBOOK, "-e",
                          "converged_awx_webhook_service=bitbucket"], env=env, capture_output=True, text=True,
                         check=False)
    assert res.returncode != 0
    assert "needs converged_awx_project_url" in res.stdout and "not 'bitbucket'" in res.stdout, res.stdout
    assert res.stdout.count("TASK [") == 1  # the check, nothing after it


# ---- awx_configure.yml run against the AWX API stand-in (tests/awx_api.py): what it sends, what it
# compares, what a second run changes
AWX_TOKEN = "awx-oauth-token-for-tests"
MUNGE = "bXVuZ2Uta2V5LWZvci10ZXN0cy0wMTIzNDU2Nzg5YWJjZGVm"
SSH_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktZm9yLXRlc3Rz\n-----END OPENSSH PRIVATE KEY-----\n"
KUBECONFIG = "apiVersion: v1\nkind: Config\nusers:\n- name: a\n  user:\n    token: kube-token-for-tests\n"
LDAP = "ldap-bind-password-for-tests"


def configure(awx, tmp_path, **given):
    values = {"converged_awx_project_url": "https://git.example.invalid/converged/hpc.git",
              "converged_awx_kubeconfig": KUBECONFIG, "converged_awx_ssh_private_key": SSH_KEY,
              "converged_awx_munge_key": MUNGE, "converged_awx_ldap_bind_password": LDAP}
    values.update(given)
    path = tmp_path / "awx-vars.json"
    path.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
    env = ansible_env(CONTROLLER_HOST=awx.url, CONTROLLER_OAUTH_TOKEN=AWX_TOKEN)
    before = len(awx.writes)
    res = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", PLAYBOOK, "-e", "@" + str(path),
                          "-e", "ansible_python_interpreter=" + sys.executable],
                         env=env, capture_output=True, text=True, check=False, timeout=600)
    text = res.stdout + res.stderr
    for secret in (MUNGE, SSH_KEY.splitlines()[1], "kube-token-for-tests", LDAP, AWX_TOKEN) + \
            tuple(v for v in given.values() if isinstance(v, str) and len(v) > 12):
        assert secret not in text, "a secret reached the output"
    recap = res.stdout.split("PLAY RECAP")[-1]
    return res, recap, awx.writes[before:]


@pytest.fixture
def awx():
    from awx_api import AwxApi
    api = AwxApi(AWX_TOKEN).start()
    yield api
    api.stop()


def test_a_second_run_changes_nothing_and_rotation_changes_exactly_what_is_named(awx, tmp_path):
    res, recap, writes = configure(awx, tmp_path)
    assert res.returncode == 0, res.stdout[-4000:]
    assert awx.secret("converged-hpc slurm secrets", "munge_key") == MUNGE
    assert awx.associated("job_templates", "converged-hpc site", "credentials") == [
        "converged-hpc machines", "converged-hpc management cluster", "converged-hpc slurm secrets"]
    # the same input again: no write at all
    res, recap, writes = configure(awx, tmp_path)
    assert res.returncode == 0 and "changed=0" in recap, res.stdout[-4000:]
    assert writes == []
    # a new munge key is not written by itself: AWX never shows the stored one
    new_key = "bmV3LW11bmdlLWtleS1mb3ItdGVzdHMtOTg3NjU0MzIxMA=="
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key)
    assert res.returncode == 0 and "changed=0" in recap and writes == [], res.stdout[-4000:]
    assert awx.secret("converged-hpc slurm secrets", "munge_key") == MUNGE
    # asked for: exactly that credential is written, once
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key,
                                   converged_awx_rotate=["slurm_secrets"])
    assert res.returncode == 0 and "changed=1" in recap, res.stdout[-4000:]
    slurm = awx.named("credentials", "converged-hpc slurm secrets")
    assert [(m, p) for m, p, _b in writes] == [("PATCH", slurm["url"])]
    assert awx.secret("converged-hpc slurm secrets", "munge_key") == new_key
    assert awx.secret("converged-hpc slurm secrets", "ldap_bind_password") == LDAP
    assert awx.secret("converged-hpc machines", "ssh_key_data") == SSH_KEY
    # all: every credential written again
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key, converged_awx_rotate=["all"])
    assert res.returncode == 0 and "changed=3" in recap, res.stdout[-4000:]
    assert sorted(p for m, p, _b in writes) == sorted(awx.named("credentials", "converged-hpc " + n)["url"] for n in
                                                      ("management cluster", "machines", "slurm secrets"))


def test_a_bad_rotation_is_named_before_any_awx_call(awx, tmp_path):
    res, _recap, writes = configure(awx, tmp_path, converged_awx_rotate=["munge"])
    assert res.returncode != 0 and "converged_awx_rotate is a list of" in res.stdout and "munge" in res.stdout
    assert writes == [] and res.stdout.count("TASK [") == 1
    res, _recap, writes = configure(awx, tmp_path, converged_awx_rotate="all")
    assert res.returncode != 0 and writes == []
