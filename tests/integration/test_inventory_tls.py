"""The inventory over HTTPS: the right CA works, a wrong one is named as a TLS verification
failure (not "cannot reach the API", not an authentication problem)."""

from conftest import ADMIN_TOKEN, self_signed
from test_inventory_cli import inventory, listing


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
