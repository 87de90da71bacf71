"""The lab machine image boots like a bare-metal Debian host: Debian 13 (trixie), or 12 (bookworm) with
MOLECULE_DEBIAN=debian12."""

import os

testinfra_hosts = ["podman://molecule-default-01"]


def test_systemd_is_pid1_and_running(host):
    assert host.file("/proc/1/comm").content_string.strip() == "systemd"
    state = host.run("systemctl is-system-running").stdout.strip()
    assert state == "running", host.run("systemctl --failed --no-legend").stdout


def test_the_debian_release_of_the_image(host):
    assert host.system_info.distribution == "debian"
    want = {"debian13": "13", "debian12": "12"}[os.environ.get("MOLECULE_DEBIAN", "debian13")]
    assert host.system_info.release.startswith(want)


def test_sshd_listening_with_own_host_keys(host):
    assert host.service("ssh").is_running
    assert host.socket("tcp://0.0.0.0:22").is_listening
    key = host.file("/etc/ssh/ssh_host_ed25519_key")
    assert key.exists and key.mode == 0o600


def test_admin_user_has_passwordless_sudo(host):
    admin = host.user("admin")
    assert admin.exists
    out = host.run("runuser -u admin -- sudo -n true")
    assert out.rc == 0, out.stderr


def test_python_for_ansible(host):
    assert host.exists("python3")
