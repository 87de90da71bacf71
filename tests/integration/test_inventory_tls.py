"""The inventory over HTTPS: the right CA works, a wrong one is named as a TLS verification
failure (not "cannot reach the API", not an authentication problem). On the session's real
kube-apiserver, the recorded namespace metal3 only."""

import subprocess

from conftest import ADMIN_TOKEN
from test_inventory_cli import inventory, listing


def another_ca(tmp_path):
    cert, key = tmp_path / "another-ca.crt", tmp_path / "another-ca.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=another-ca", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert)


def test_right_ca_lists_wrong_ca_says_tls_verification_failed(backend, tmp_path):
    assert backend.url.startswith("https://")
    config = {"host": backend.url, "api_key": ADMIN_TOKEN, "namespaces": ["metal3"]}
    data = listing(inventory(tmp_path, dict(config, ca_cert=backend.ca_cert)))
    assert len(data["compute"]["hosts"]) == 2 and len(data["controller"]["hosts"]) == 2
    proc = inventory(tmp_path, dict(config, ca_cert=another_ca(tmp_path)))
    assert proc.returncode != 0
    assert "TLS verification of the Kubernetes API at %s failed" % backend.url in proc.stderr, proc.stderr
    assert ADMIN_TOKEN not in proc.stderr + proc.stdout
