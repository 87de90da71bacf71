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
