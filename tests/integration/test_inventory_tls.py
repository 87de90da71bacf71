"""The inventory over HTTPS: the right CA works, a wrong one is named as a TLS verification
failure (not "cannot reach the API", not an authentication problem)."""

import subprocess

import pytest

from conftest import ADMIN_TOKEN, load_fixture
from capisim import Identity, Simulator, Store
from test_inventory_cli import inventory, listing


def self_signed(tmp_path, name):
    cert, key = tmp_path / (name + ".crt"), tmp_path / (name + ".key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=" + name, "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture
def tls_sim(tmp_path):
    store = Store()
    store.load(load_fixture("capi-hpc.yaml"))
    server = Simulator(store, {ADMIN_TOKEN: Identity("admin")}, tls=self_signed(tmp_path, "capisim")).start()
    yield server
    server.stop()


def test_right_ca_lists_wrong_ca_says_tls_verification_failed(tls_sim, tmp_path):
    assert tls_sim.url.startswith("https://")
    data = listing(inventory(tmp_path, {"host": tls_sim.url, "api_key": ADMIN_TOKEN,
                                        "ca_cert": str(tmp_path / "capisim.crt")}))
    assert len(data["compute"]["hosts"]) == 4
    wrong_ca, dummy = self_signed(tmp_path, "another-ca")
    proc = inventory(tmp_path, {"host": tls_sim.url, "api_key": ADMIN_TOKEN, "ca_cert": wrong_ca})
    assert proc.returncode != 0
    assert "TLS verification of the Kubernetes API at %s failed" % tls_sim.url in proc.stderr, proc.stderr
    assert ADMIN_TOKEN not in proc.stderr + proc.stdout
