"""The inventory over HTTPS: the right CA works, a wrong one is named as a TLS verification
failure (not "cannot reach the API", not an authentication problem). On the session's real
kube-apiserver, the recorded namespace metal3 only."""

import functools
import socket
import subprocess

from conftest import ADMIN_TOKEN
from kubeapi import CA_EXTENSIONS, free_port
from labkit import ansible_core_path, wait_for
from test_inventory_cli import inventory, listing

# the newest ansible-core the collection supports; tests/ansible_core.sh makes its venv on the newest Python
# 3.12+ of the machine (3.13 on these: the strict X.509 checks)
NEWEST = "2.21"


def another_ca(tmp_path):
    cert, key = tmp_path / "another-ca.crt", tmp_path / "another-ca.key"
    # a good CA (as kubeadm makes one), only not the server's: refused for that, on any Python
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=another-ca", *CA_EXTENSIONS, "-keyout", str(key), "-out", str(cert)],
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


def test_on_the_newest_core_and_python_the_inventory_takes_a_real_cas_certificate(backend, tmp_path):
    path = ansible_core_path(NEWEST)
    python = subprocess.run(["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            env={"PATH": path}, capture_output=True, text=True, check=True).stdout.strip()
    config = {"host": backend.url, "api_key": ADMIN_TOKEN, "namespaces": ["metal3"]}
    data = listing(inventory(tmp_path, dict(config, ca_cert=backend.ca_cert), env={"PATH": path}))
    assert len(data["compute"]["hosts"]) == 2, "ansible-core %s on Python %s" % (NEWEST, python)
    # a server whose CA was made without the extensions a real CA puts in (openssl req -x509 and nothing
    # else): Python 3.13's strict checks refuse it, and the error says what Python wants
    run = functools.partial(subprocess.run, check=True, capture_output=True, cwd=str(tmp_path))
    run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=bare-ca",
         "-keyout", "bare-ca.key", "-out", "bare-ca.crt"])
    run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=server", "-keyout", "server.key",
         "-out", "server.csr"])
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(["openssl", "x509", "-req", "-in", "server.csr", "-CA", "bare-ca.crt", "-CAkey", "bare-ca.key",
         "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt"])
    port = free_port()
    server = subprocess.Popen(["openssl", "s_server", "-quiet", "-accept", "127.0.0.1:%d" % port, "-cert", "server.crt",
                               "-key", "server.key", "-www"], cwd=str(tmp_path), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_for("openssl s_server on port %d" % port, lambda: port_open(port), 30, poll=0.2)
        url = "https://127.0.0.1:%d" % port
        proc = inventory(tmp_path, dict(config, host=url, ca_cert=str(tmp_path / "bare-ca.crt")), env={"PATH": path})
    finally:
        server.kill()
        server.wait()
    assert proc.returncode != 0 and "TLS verification of the Kubernetes API at %s failed" % url in proc.stderr, \
        proc.stderr
    if tuple(int(x) for x in python.split(".")) >= (3, 13):
        assert "Python 3.13 and later check certificates strictly" in proc.stderr, proc.stderr


def port_open(port):
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
