"""The job side as AWX runs it, with the real ansible-runner (AWX's job runner): the project's inventory
source (inventories/capi.capi_machines.yml) updated with the management cluster credential injected the
way AWX injects it - the built-in "OpenShift or Kubernetes API Bearer Token" (K8S_AUTH_HOST,
K8S_AUTH_API_KEY, K8S_AUTH_VERIFY_SSL, K8S_AUTH_SSL_CA_CERT as a path) and the collection's kubeconfig
credential type (K8S_AUTH_KUBECONFIG, a file AWX writes) - over HTTPS; then a job of the reconcile
template on that inventory, with a GitHub-style awx_webhook_payload, reaching the management
cluster through the same credential. (No Slurm answers here: the lab's e2e runs the whole reconcile
through ansible-runner.) No token in any artifact runner keeps. On a real kube-apiserver,
over HTTPS with its CA."""

import json
import os
import stat

import pytest
import yaml

from conftest import ADMIN_TOKEN, COLLECTIONS, REPO

ansible_runner = pytest.importorskip("ansible_runner")


def private_data_dir(tmp_path):
    """AWX's layout: the project checked out under project/, credential files under env/ (mode 0600)."""
    pdd = tmp_path / "pdd"
    (pdd / "env").mkdir(parents=True)
    os.symlink(REPO, pdd / "project")
    return pdd


def secret_file(path, text):
    path.write_text(text)
    path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return str(path)


def bearer_token_credential(pdd, backend):
    """What AWX's built-in Kubernetes bearer token credential puts in the job's environment."""
    with open(backend.ca_cert) as fh:
        ca = secret_file(pdd / "env" / "k8s_ca.crt", fh.read())
    return {"K8S_AUTH_HOST": backend.url, "K8S_AUTH_API_KEY": ADMIN_TOKEN, "K8S_AUTH_VERIFY_SSL": "True",
            "K8S_AUTH_SSL_CA_CERT": ca}


def kubeconfig_credential(pdd, backend):
    """What the collection's kubeconfig credential type injects: the file, and K8S_AUTH_KUBECONFIG naming it."""
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "mgmt",
                  "clusters": [{"name": "mgmt", "cluster": {"server": backend.url,
                                                            "certificate-authority": backend.ca_cert}}],
                  "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
                  "contexts": [{"name": "mgmt", "context": {"cluster": "mgmt", "user": "admin"}}]}
    return {"K8S_AUTH_KUBECONFIG": secret_file(pdd / "env" / "kubeconfig", yaml.safe_dump(kubeconfig))}


def runner_env(credential):
    # the fixture's machines do not exist: a short SSH timeout finds that out sooner
    env = {"ANSIBLE_COLLECTIONS_PATH": COLLECTIONS, "ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_TIMEOUT": "5"}
    env.update(credential)
    return env


def clean_environ(monkeypatch):
    for key in [k for k in os.environ if k.startswith("K8S_AUTH_")] + ["KUBECONFIG"]:
        monkeypatch.delenv(key, raising=False)


def job_output(pdd):
    """Everything the job printed or emitted (stdout, job events); not runner's record of the environment it
    was given (artifacts/*/command: AWX's job_env, which AWX redacts)."""
    text = ""
    for root, _dirs, files in os.walk(pdd / "artifacts"):
        for name in files:
            if name == "command":
                continue
            with open(os.path.join(root, name), errors="replace") as handle:
                text += handle.read()
    return text


@pytest.mark.parametrize("credential", [bearer_token_credential, kubeconfig_credential])
def test_inventory_update_then_a_webhook_job_as_awx_runs_them(backend, tmp_path, monkeypatch, credential):
    clean_environ(monkeypatch)
    pdd = private_data_dir(tmp_path)
    envvars = runner_env(credential(pdd, backend))

    # the inventory update: ansible-inventory on the project's source file, in the project
    out, err = ansible_runner.interface.get_inventory(
        "list", [os.path.join(str(pdd / "project"), "inventories", "capi.capi_machines.yml")],
        response_format="json", envvars=envvars, host_cwd=str(pdd / "project"), quiet=True)
    assert isinstance(out, dict), err
    # the project's file reads namespace metal3: its two compute Machines and its controller
    assert len(out["compute"]["hosts"]) == 2 and out["controller"]["hosts"], sorted(out)
    assert ADMIN_TOKEN not in json.dumps(out) + (err or "")

    # the job: AWX hands the synced hosts to the job as an inventory script
    script = pdd / "inventory" / "hosts"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\ncat <<'EOF'\n%s\nEOF\n" % json.dumps(out))
    script.chmod(0o700)
    payload = {"reasons": ["up"], "resourceVersion": "77", "at": 1.5,
               "machines": [{"namespace": "metal3", "name": "not-a-machine-here", "resourceVersion": "77"}]}
    run = ansible_runner.run(private_data_dir=str(pdd), playbook="playbooks/reconcile.yml", envvars=envvars,
                             extravars={"awx_webhook_payload": payload, "awx_webhook_event_type": "converged-hpc",
                                        "converged_lease_duration": 5},
                             quiet=True, timeout=300)
    stdout = run.stdout.read()
    # the contract passed and the Lease was taken through the injected credential; the lab's machines do
    # not exist here, so no controller answers, and the run says so in one line
    assert "TASK [Take the run's Lease]" in stdout, stdout[-3000:]
    assert "no Slurm controller answers" in stdout, stdout[-3000:]
    lease = backend.api().get("coordination.k8s.io/v1", "leases", "default", "converged-hpc")
    assert "ansible-playbook pid" in lease["spec"]["holderIdentity"]
    assert run.rc != 0
    assert ADMIN_TOKEN not in job_output(pdd)
