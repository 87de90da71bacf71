"""playbooks/awx_configure.yml runs against a real AWX, which cannot be installed here. What can be
checked without one is checked: every awx.awx option it uses is one `ansible-doc` documents (with a
literal value among its choices), every task handing over a secret is no_log, every playbook and
inventory file it names exists in the project, the webhook templates are the reconcile and scale
ones, and bad input fails before any AWX call, naming what is missing."""

import functools
import glob
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import COLLECTIONS, REPO, ansible_env

PLAYBOOK = os.path.join(REPO, "playbooks", "awx_configure.yml")
SECRET_INPUTS = ("kubeconfig", "bearer_token", "ssh_key_data", "munge_key", "ldap_bind_password", "vrrp_password",
                 "accounting_db_password", "jwt_key")


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


def configure(awx, tmp_path, extra_args=(), **given):
    values = {"converged_awx_project_url": "https://git.example.invalid/converged/hpc.git",
              "converged_awx_kubeconfig": KUBECONFIG, "converged_awx_ssh_private_key": SSH_KEY,
              "converged_awx_munge_key": MUNGE, "converged_awx_ldap_bind_password": LDAP}
    values.update(given)
    path = tmp_path / "awx-vars.json"
    path.write_text(json.dumps({k: v for k, v in values.items() if v is not None}))
    env = ansible_env(CONTROLLER_HOST=awx.url, CONTROLLER_OAUTH_TOKEN=AWX_TOKEN)
    before, asked = len(awx.writes), len(awx.requests)
    res = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", PLAYBOOK, "-e", "@" + str(path),
                          "-e", "ansible_python_interpreter=" + sys.executable] + list(extra_args),
                         env=env, capture_output=True, text=True, check=False, timeout=600)
    text = res.stdout + res.stderr
    for secret in (MUNGE, SSH_KEY.splitlines()[1], "kube-token-for-tests", LDAP, AWX_TOKEN) + \
            tuple(v for k, v in given.items() if isinstance(v, str) and len(v) > 12 and k != "converged_awx_site_credentials"):
        assert secret not in text, "a secret reached the output"
    recap = res.stdout.split("PLAY RECAP")[-1]
    configure.requests = awx.requests[asked:]
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
    assert awx.secret("converged-hpc munge key", "munge_key") == MUNGE
    # the secrets given, one credential each, and only those: no VRRP password was given
    for template in ("site", "reconcile", "autoscale"):
        assert awx.associated("job_templates", "converged-hpc " + template, "credentials") == [
            "converged-hpc LDAP bind password", "converged-hpc machines", "converged-hpc management cluster",
            "converged-hpc munge key"]
    assert awx.named("credentials", "converged-hpc VRRP password") is None
    # the same input again: no write at all
    res, recap, writes = configure(awx, tmp_path)
    assert res.returncode == 0 and "changed=0" in recap, res.stdout[-4000:]
    assert writes == []
    # a new munge key is not written by itself: AWX never shows the stored one
    new_key = "bmV3LW11bmdlLWtleS1mb3ItdGVzdHMtOTg3NjU0MzIxMA=="
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key)
    assert res.returncode == 0 and "changed=0" in recap and writes == [], res.stdout[-4000:]
    assert awx.secret("converged-hpc munge key", "munge_key") == MUNGE
    # asked for: exactly that credential is written, once
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key, converged_awx_rotate=["munge_key"])
    assert res.returncode == 0 and "changed=1" in recap, res.stdout[-4000:]
    munge = awx.named("credentials", "converged-hpc munge key")
    assert [(m, p) for m, p, _b in writes] == [("PATCH", munge["url"])]
    assert awx.secret("converged-hpc munge key", "munge_key") == new_key
    assert awx.secret("converged-hpc LDAP bind password", "ldap_bind_password") == LDAP
    assert awx.secret("converged-hpc machines", "ssh_key_data") == SSH_KEY
    # all: every credential written again
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key, converged_awx_rotate=["all"])
    assert res.returncode == 0 and "changed=3" in recap, res.stdout[-4000:]  # the secrets' credentials: one task
    assert sorted(p for m, p, _b in writes) == sorted(awx.named("credentials", "converged-hpc " + n)["url"] for n in
                                                      ("management cluster", "machines", "munge key",
                                                       "LDAP bind password"))
    # a secret no longer given: its credential is no longer attached (the job reads the inventory's value)
    res, recap, writes = configure(awx, tmp_path, converged_awx_munge_key=new_key, converged_awx_ldap_bind_password=None)
    assert res.returncode == 0, res.stdout[-4000:]
    assert "converged-hpc LDAP bind password" not in awx.associated("job_templates", "converged-hpc site", "credentials")


def test_a_bad_rotation_is_named_before_any_awx_call(awx, tmp_path):
    res, _recap, writes = configure(awx, tmp_path, converged_awx_rotate=["munge"])
    assert res.returncode != 0 and "converged_awx_rotate is a list of" in res.stdout and "munge" in res.stdout
    assert configure.requests == [] and res.stdout.count("TASK [") == 1
    res, _recap, writes = configure(awx, tmp_path, converged_awx_rotate="all")
    assert res.returncode != 0 and configure.requests == []


def test_a_secret_among_the_extra_vars_is_refused_naming_its_credential(awx, tmp_path):
    extra = tmp_path / "extra.yml"
    extra.write_text("slurm_partition_default: batch\ndb_password: x\n")
    res, _recap, _writes = configure(awx, tmp_path, converged_awx_extra_vars={
        "converged_ha": True, "munge_key": "a-munge-key-in-clear", "keepalived_vip": "10.0.0.254",
        "sssd_ldap_bind_password": "a-bind-password-in-clear", "slurmrestd_jwt_key": "k", "munge_key_source": "x"},
        converged_awx_extra_vars_file=str(extra))
    text = " ".join(res.stdout.split())
    assert res.returncode != 0 and configure.requests == [], text[-3000:]
    assert 'munge_key belongs in converged_awx_munge_key (the credential "converged-hpc munge key")' in text
    assert 'sssd_ldap_bind_password belongs in converged_awx_ldap_bind_password' in text
    assert "slurmrestd_jwt_key belongs in a credential of a custom credential type" in text
    assert "db_password belongs in" in text
    for fine in ("converged_ha", "keepalived_vip", "munge_key_source", "slurm_partition_default"):
        assert fine + " belongs" not in text


def test_job_side_jinja_reaches_the_job_as_written(awx, tmp_path):
    # a lookup meant to run inside the job: from the file, or marked !unsafe, it is stored as written
    extra = tmp_path / "extra.yml"
    extra.write_text("slurm_account_db: \"{{ lookup('ansible.builtin.env', 'SITE_DB') }}\"\nconverged_ha: true\n")
    vars_file = tmp_path / "more.yml"
    vars_file.write_text("converged_awx_extra_vars:\n  keepalived_vip: !unsafe \"{{ lookup('ansible.builtin.env', 'VIP') }}\"\n")
    res, _recap, _writes = configure(awx, tmp_path, converged_awx_extra_vars_file=str(extra),
                                     extra_args=["-e", "@" + str(vars_file)])
    assert res.returncode == 0, res.stdout[-3000:]
    stored = json.loads(awx.named("job_templates", "converged-hpc site")["extra_vars"])
    assert stored == {"keepalived_vip": "{{ lookup('ansible.builtin.env', 'VIP') }}",
                      "slurm_account_db": "{{ lookup('ansible.builtin.env', 'SITE_DB') }}", "converged_ha": True}


def test_a_secret_read_by_a_lookup_the_job_runs_is_accepted_and_stored_as_written(awx, tmp_path):
    # the safe way to read a vault: the job runs the lookup, nothing secret is stored in the template
    vault = "{{ lookup('community.hashi_vault.vault_kv2_get', 'slurm/db', engine_mount_point='kv').secret.password }}"
    extra = tmp_path / "extra.yml"
    extra.write_text("slurm_common_jwt_key: \"{{ query('ansible.builtin.env', 'SITE_JWT') | first }}\"\n")
    vars_file = tmp_path / "more.yml"
    vars_file.write_text("converged_awx_extra_vars:\n  slurmdbd_storage_password: !unsafe \"%s\"\n" % vault)
    res, _recap, _writes = configure(awx, tmp_path, converged_awx_extra_vars_file=str(extra),
                                     extra_args=["-e", "@" + str(vars_file)])
    assert res.returncode == 0, res.stdout[-3000:]
    stored = json.loads(awx.named("job_templates", "converged-hpc site")["extra_vars"])
    assert stored == {"slurmdbd_storage_password": vault,
                      "slurm_common_jwt_key": "{{ query('ansible.builtin.env', 'SITE_JWT') | first }}"}
    # not !unsafe, the lookup runs here and a plain value is left: refused, as is a value in clear
    vars_file.write_text("converged_awx_extra_vars:\n  slurmdbd_storage_password: \"{{ lookup('ansible.builtin.env', "
                         "'HOME') }}\"\n  site_token: \"not {{ lookup('ansible.builtin.env', 'HOME') }}\"\n")
    res, _recap, _writes = configure(awx, tmp_path, extra_args=["-e", "@" + str(vars_file)])
    text = " ".join(res.stdout.split())
    assert res.returncode != 0 and configure.requests == [], text[-3000:]
    assert "slurmdbd_storage_password belongs in converged_awx_accounting_db_password" in text, text[-3000:]
    assert "site_token belongs in a credential of a custom credential type" in text


def test_a_site_credential_is_attached_to_every_template_and_kept(awx, tmp_path):
    # what a site made itself: a custom type injecting a secret the collection has no type for
    site_type = awx.handle("POST", "/api/v2/credential_types/", {}, {
        "name": "site vault", "kind": "cloud", "inputs": {"fields": [{"id": "token", "type": "string", "secret": True}]},
        "injectors": {"env": {"VAULT_TOKEN": "{{ token }}"}}})[1]
    awx.handle("POST", "/api/v2/credentials/", {}, {"name": "site vault token", "organization": 1,
                                                    "credential_type": site_type["id"], "inputs": {"token": "t0k"}})
    res, _recap, _writes = configure(awx, tmp_path, converged_awx_site_credentials=["site vault token"])
    assert res.returncode == 0, res.stdout[-3000:]
    ours = ["converged-hpc LDAP bind password", "converged-hpc machines", "converged-hpc management cluster",
            "converged-hpc munge key"]
    templates = [t["name"] for t in awx.objects["job_templates"].values()]
    assert len(templates) == 7
    for template in templates:
        assert awx.associated("job_templates", template, "credentials") == sorted(ours + ["site vault token"])
    # the second run: nothing written, the site's credential still on every template
    res, recap, writes = configure(awx, tmp_path, converged_awx_site_credentials=["site vault token"])
    assert res.returncode == 0 and "changed=0" in recap and writes == [], res.stdout[-4000:]
    for template in templates:
        assert "site vault token" in awx.associated("job_templates", template, "credentials")
    # one AWX does not have, or a bad list: named, nothing written
    res, _recap, writes = configure(awx, tmp_path, converged_awx_site_credentials=["site vault token", "no such one"])
    text = " ".join(res.stdout.split())
    assert res.returncode != 0 and writes == [], text[-3000:]
    assert "converged_awx_site_credentials names 'no such one', and AWX has 0 credentials of that name" in text
    assert "site vault token', and AWX" not in text
    res, _recap, writes = configure(awx, tmp_path, converged_awx_site_credentials="site vault token")
    assert res.returncode != 0 and configure.requests == [], res.stdout[-3000:]
    assert "converged_awx_site_credentials is a list of credential names" in " ".join(res.stdout.split())


def test_every_secret_a_role_reads_has_a_credential_type():
    # every option a role's argument specs mark no_log
    secret_options = set()
    for spec in glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml")):
        with open(spec) as fh:
            for entry in (yaml.safe_load(fh).get("argument_specs") or {}).values():
                secret_options |= {name for name, option in (entry.get("options") or {}).items()
                                   if option.get("no_log")}
    play, _body = tasks()
    injected = {var for secret in play["vars"]["awx_slurm_secrets"] for var in secret["extra_vars"]}
    assert secret_options and secret_options <= injected, secret_options - injected
    assert secret_options <= set(play["vars"]["awx_secret_homes"])
    assert {s["id"] for s in play["vars"]["awx_slurm_secrets"]} <= set(play["vars"]["awx_rotate_choices"])


def test_the_combined_credential_of_earlier_versions_is_removed(awx, tmp_path):
    # what an earlier awx_configure.yml made: one type injecting every secret, empty ones included
    old_type = awx.handle("POST", "/api/v2/credential_types/", {}, {
        "name": "converged-hpc slurm secrets", "kind": "cloud", "inputs": {"fields": [
            {"id": "munge_key", "type": "string", "secret": True}]},
        "injectors": {"extra_vars": {"munge_key": "{{ munge_key }}"}}})[1]
    awx.handle("POST", "/api/v2/credentials/", {}, {
        "name": "converged-hpc slurm secrets", "organization": 1, "credential_type": old_type["id"],
        "inputs": {"munge_key": MUNGE}})
    res, _recap, _writes = configure(awx, tmp_path)
    assert res.returncode == 0, res.stdout[-3000:]
    assert awx.named("credentials", "converged-hpc slurm secrets") is None
    assert awx.named("credential_types", "converged-hpc slurm secrets") is None


# ---- what a job sees of the Slurm secrets, as AWX injects the credentials awx_configure.yml made, run by
# the real ansible-runner: for each combination of given and absent secrets
VRRP = "vrrp-pw1"
DB = "accounting-db-password-for-tests"
JWT = "4a5b6c7d8e9f0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b"
SEEN_PLAY = """
- hosts: all
  gather_facts: false
  tasks:
    - name: What the job sees, as hashes (no secret in any output)
      ansible.builtin.debug:
        msg: "SEEN {{ {'munge_key': munge_key | default('') | hash('sha256'),
                        'munge_key_source': munge_key_source | default(''),
                        'sssd_ldap_bind_password': sssd_ldap_bind_password | default('') | hash('sha256'),
                        'keepalived_auth_pass': keepalived_auth_pass | default('') | hash('sha256'),
                        'slurmdbd_storage_password': slurmdbd_storage_password | default('') | hash('sha256'),
                        'slurm_common_jwt_key': slurm_common_jwt_key | default('') | hash('sha256')} | to_json }}"
"""
INVENTORY_VALUES = {"munge_key_source": "secret", "sssd_ldap_bind_password": "the-inventorys-bind-password",
                    "keepalived_auth_pass": "inv-vrrp", "slurmdbd_storage_password": "the-inventorys-db-password",
                    "slurm_common_jwt_key": "the-inventorys-jwt-key"}
# each secret the roles read: its credential type's name, its input, a value, the variable the job gets
SECRETS = [("munge key", "munge_key", MUNGE, "munge_key"),
           ("LDAP bind password", "ldap_bind_password", LDAP, "sssd_ldap_bind_password"),
           ("VRRP password", "vrrp_password", VRRP, "keepalived_auth_pass"),
           ("accounting database password", "accounting_db_password", DB, "slurmdbd_storage_password"),
           ("JWT key", "jwt_key", JWT, "slurm_common_jwt_key")]
SECRET_NAMES = [secret[0] for secret in SECRETS]


@pytest.fixture(scope="module")
def secret_types(tmp_path_factory):
    """The Slurm secrets' credential types as awx_configure.yml makes them, read back from the stand-in."""
    from awx_api import AwxApi
    api = AwxApi(AWX_TOKEN).start()
    try:
        res, _recap, _writes = configure(api, tmp_path_factory.mktemp("configure"), converged_awx_vrrp_password=VRRP,
                                         converged_awx_accounting_db_password=DB, converged_awx_jwt_key=JWT)
        assert res.returncode == 0, res.stdout[-3000:]
        assert api.associated("job_templates", "converged-hpc site", "credentials") == sorted(
            ["converged-hpc machines", "converged-hpc management cluster"] + ["converged-hpc " + n for n in SECRET_NAMES])
        return {name: api.named("credential_types", "converged-hpc " + name) for name in SECRET_NAMES}
    finally:
        api.stop()


def sha(text):
    import hashlib
    return hashlib.sha256(text.encode()).hexdigest()


def test_each_secret_type_injects_its_own_variable_and_no_other(secret_types, tmp_path):
    """Each credential type alone, as AWX renders its injectors: its role variable (and, for the munge key, the
    key's source), nothing of another secret's. The runs below then give a real job none, all, and the
    accounting database password alone."""
    import yaml
    from awx_api import inject
    for name, field, value, var in SECRETS:
        path = inject(secret_types[name], {field: value}, str(tmp_path))
        with open(path) as fh:
            injected = yaml.safe_load(fh)
        assert injected == dict({var: value}, **({"munge_key_source": "variable"} if var == "munge_key" else {})), name


# none, all, and the accounting database password alone (the one a site's own credential carried before)
@pytest.mark.parametrize("given", [(), tuple(SECRET_NAMES), ("accounting database password",)],
                         ids=lambda given: "+".join(given) or "none")
def test_a_job_sees_exactly_the_secrets_given(secret_types, tmp_path, given):
    ansible_runner = pytest.importorskip("ansible_runner")
    from awx_api import inject
    pdd = tmp_path / "pdd"
    (pdd / "env").mkdir(parents=True)
    (pdd / "inventory").mkdir()
    (pdd / "inventory" / "hosts").write_text(
        "localhost ansible_connection=local ansible_python_interpreter=%s\n[all:vars]\n%s\n" % (
            sys.executable, "\n".join("%s=%s" % kv for kv in INVENTORY_VALUES.items())))
    (pdd / "project").mkdir()
    (pdd / "project" / "seen.yml").write_text(SEEN_PLAY)
    files = [inject(secret_types[name], {field: value}, str(pdd / "env"))
             for name, field, value, _var in SECRETS if name in given]
    run = ansible_runner.run(private_data_dir=str(pdd), playbook="seen.yml", quiet=True, timeout=120,
                             cmdline=" ".join("-e @%s" % f for f in files),
                             envvars={"ANSIBLE_COLLECTIONS_PATH": COLLECTIONS, "ANSIBLE_NOCOLOR": "1"})
    stdout = run.stdout.read()
    assert run.rc == 0, stdout[-3000:]
    line = next(line for line in stdout.splitlines() if '"msg": "SEEN ' in line)
    seen = json.loads(json.loads("{%s}" % line.strip())["msg"][len("SEEN "):])
    expected = {var: sha(value if name in given else INVENTORY_VALUES.get(var, "")) for name, _f, value, var in SECRETS}
    expected["munge_key_source"] = "variable" if "munge key" in given else INVENTORY_VALUES["munge_key_source"]
    assert seen == expected
    output = stdout
    for root, _dirs, names in os.walk(pdd / "artifacts"):
        for name in names:
            if name != "command":  # runner's record of its command line and environment, which AWX redacts
                with open(os.path.join(root, name), errors="replace") as fh:
                    output += fh.read()
    for _name, _field, secret, _var in SECRETS:
        assert secret not in output


def test_the_documented_rotations_are_ones_the_playbook_takes():
    with open(PLAYBOOK) as fh:
        choices = re.sub(r"\s", "", re.search(r"awx_rotate_choices: \[([^\]]*)\]", fh.read()).group(1)).split(",")
    with open(os.path.join(REPO, "docs", "awx.md")) as fh:
        docs = fh.read()
    examples = re.findall(r'"converged_awx_rotate": (\[[^\]]*\])', docs)
    assert examples, "docs/awx.md shows no rotation"
    for example in examples:
        assert set(json.loads(example)) <= set(choices + ["all"]), example
    listed = re.search(r"`converged_awx_rotate` takes ((?:`\w+`,?\s*(?:or\s+)?)+)", docs.replace("\n", " ")).group(1)
    assert set(re.findall(r"`(\w+)`", listed)) == set(choices + ["all"]), listed
