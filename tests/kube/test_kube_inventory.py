"""converged.hpc.capi_machines (ansible-inventory) against a real kube-apiserver holding the objects the
transcripts were recorded from: groups, lean and full hostvars, a kubeconfig and its context over TLS,
401, 403, and a token that may only read Machines."""

import json
import subprocess

import yaml

from conftest import ADMIN_TOKEN, READONLY_TOKEN, ansible_env
from kubeapi import NOBODY_TOKEN

RECORDED = ["metal3", "lab2"]


def inventory(tmp_path, config, env=None):
    path = tmp_path / "test.capi_machines.yml"
    path.write_text(yaml.safe_dump(dict({"plugin": "converged.hpc.capi_machines", "namespaces": RECORDED}, **config)))
    proc = subprocess.run(["ansible-inventory", "-i", str(path), "--list"], capture_output=True, text=True,
                          env=ansible_env(**(env or {})), cwd=str(tmp_path), timeout=120, check=False)
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr and READONLY_TOKEN not in proc.stdout + proc.stderr
    return proc


def _plain(value):
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def listing(proc):
    assert proc.returncode == 0, proc.stderr
    return _plain(json.loads(proc.stdout))


def error_line(proc):
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if "converged.hpc.capi_machines" in line]
    assert lines and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def auth(kube, token=ADMIN_TOKEN):
    return {"host": kube.url, "api_key": token, "ca_cert": kube.ca_cert}


def test_groups_and_lean_hostvars(kube, tmp_path):
    data = listing(inventory(tmp_path, auth(kube)))
    assert sorted(data["controller"]["hosts"]) == ["hpc-controller-5c6b9-q8m4n", "hpc-controller-5c6b9-x7k2p"]
    assert sorted(data["compute"]["hosts"]) == ["edge-workers-6f5d4-m2wq7", "edge-workers-6f5d4-r8t3k",
                                                "hpc-compute-7d9f8-abcde", "hpc-compute-7d9f8-fghij"]
    assert data["capi_deleting"]["hosts"] == ["hpc-compute-7d9f8-pqrst"]
    hv = data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]
    assert hv["ansible_host"] == "192.168.111.21"
    assert (hv["capi"]["cpus"], hv["capi"]["namespace"], hv["capi"]["api_version"]) == \
        (128, "metal3", "cluster.x-k8s.io/v1beta2")
    # a Machine created through v1beta1 (refs without apiGroup) maps as the others
    assert data["_meta"]["hostvars"]["edge-workers-6f5d4-m2wq7"]["ansible_host"] == "192.168.111.51"


def test_full_hostvars(kube, tmp_path):
    data = listing(inventory(tmp_path, dict(auth(kube), hostvars="full")))
    hv = data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]["capi"]
    assert {n["name"] for n in hv["nics"]} == {"eno1", "ens3f0np0"}
    assert (hv["bmh"], hv["bmh_namespace"], hv["metal3_machine"]) == ("hpc-cn-01", "metal3", "hpc-compute-7d9f8-abcde")


def test_kubeconfig_context_and_its_certificate_authority(kube, tmp_path):
    path = kube.kubeconfig(tmp_path / "kubeconfig", ADMIN_TOKEN, context="mgmt")
    data = listing(inventory(tmp_path, {"kubeconfig": path, "context": "mgmt"}))
    assert len(data["controller"]["hosts"]) == 2
    data = listing(inventory(tmp_path, {}, env={"K8S_AUTH_KUBECONFIG": path}))
    assert len(data["controller"]["hosts"]) == 2


def test_a_server_it_cannot_verify_is_named(kube, tmp_path):
    line = error_line(inventory(tmp_path, {"host": kube.url, "api_key": ADMIN_TOKEN}))
    assert "TLS verification of the Kubernetes API at %s failed" % kube.url in line


def test_401_and_403_are_one_clear_line(kube, tmp_path):
    line = error_line(inventory(tmp_path, auth(kube, "not-a-token")))
    assert "rejected the credentials (401 Unauthorized)" in line and "not-a-token" not in line
    line = error_line(inventory(tmp_path, auth(kube, NOBODY_TOKEN)))
    assert "refused to list machines.cluster.x-k8s.io" in line and "403 Forbidden" in line
    assert 'User \\"nobody\\"' in line or 'User "nobody"' in line


def test_a_token_that_may_only_read_machines(kube, tmp_path):
    # Machines only: the whole inventory, no hardware
    data = listing(inventory(tmp_path, dict(auth(kube, READONLY_TOKEN), metal3="never")))
    assert len(data["controller"]["hosts"]) == 2 and len(data["compute"]["hosts"]) == 4
    assert data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]["capi"]["cpus"] is None
    # with Metal3 data asked for and refused: auto warns and maps the Machines, always fails
    proc = inventory(tmp_path, dict(auth(kube, READONLY_TOKEN), metal3="auto"))
    data = listing(proc)
    assert len(data["compute"]["hosts"]) == 4 and "403" in proc.stderr, proc.stderr
    line = error_line(inventory(tmp_path, dict(auth(kube, READONLY_TOKEN), metal3="always")))
    assert "403" in line and "metal3machines" in line
