"""Debian forky (testing) machines in a lab of their own (LAB_SUITE=forky): Slurm 26.05, Python 3.14 on the hosts,
run by ansible-core 2.21 (2.20 is the first to support a Python 3.14 target; tests/ansible_core.sh gives its
venv a Python 3.12+ control node). forky has no SSSD that day (no directory: LAB_DIRECTORY=0), and this host's
cgroups (v1, hybrid) are refused by its systemd and by Slurm 26.05: the machines mount cgroup2 in a namespace of
their own (lab/machines.py), and the lab's Slurm tracks processes without cgroups (lab/lab.sh's forky.yml). The
main job as on trixie: site.yml and validate.yml (srun, sbatch, MPI, munge, accounting, REST), a whole converge
again that changes nothing but the stamp."""

import os
import re

import pytest

from labkit import Lab, ansible_core_path, has_podman

CTL, CN = "flab-ctl-01", "flab-cn-01"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    lab = Lab("flab", "10.89.79", 16479, ".lab/e2e-forky", LAB_SUITE="forky", LAB_COMPUTE="1", LAB_DIRECTORY="0")
    lab.env["PATH"] = ansible_core_path("2.21")
    lab.up()
    yield lab
    lab.down()


def test_the_hosts_run_forky_with_slurm_26_05_and_python_3_14(lab):
    assert lab.slurm_release(CTL) == "26.05" and lab.slurm_release(CN) == "26.05"
    assert lab.on(CN, "python3 -c 'import sys; print(sys.version_info[:2])'").stdout.strip() == "(3, 14)"
    assert lab.on(CTL, ". /etc/os-release; echo $VERSION_CODENAME").stdout.strip() == "forky"
    assert lab.sh("ansible", "--version").stdout.splitlines()[0].startswith("ansible [core 2.21.")


def test_the_main_job_validates_on_slurm_26_05(lab):
    log = open(os.path.join(lab.state, "logs", "validate.log")).read()
    for line in ("nodes IDLE: 1 (%s)" % CN, "MPI (srun --mpi=pmi2): 1 rank(s) reported",
                 "munge: controller -> 1 compute node(s) and back: decoded"):
        assert line in log, log[-3000:]
    assert re.search(r"sbatch job \d+ over compute: exit code 0", log), log[-3000:]
    assert re.search(r"accounting: sacct job \d+\|COMPLETED\|0:0", log), log[-3000:]
    # the REST API version of the release (docs/releases.md): 26.05 serves v0.0.45
    assert "REST: slurmrestd v0.0.45 on port 6820" in log, log[-3000:]


def test_a_whole_converge_again_changes_nothing(lab):
    res = lab.playbook("site.yml", "converged_skip_unchanged=false")
    assert res.returncode == 0, res.stdout[-4000:]
    changed = re.findall(r"changed: \[([^\]]+)\]", res.stdout)
    recorded = res.stdout.count("TASK [Record the host's state")
    assert recorded == 1 and len(changed) <= 2, res.stdout[-4000:]
    res = lab.playbook("site.yml")
    assert res.returncode == 0 and "nothing to do" in res.stdout, res.stdout[-3000:]


def test_the_identity_role_refuses_forky_naming_the_packages_it_lacks(lab):
    # a directory asked for on forky: the sssd role stops before installing anything, naming what the
    # archive lacks and what a site does instead
    res = lab.playbook("identity.yml", "sssd_ldap_uri=ldap://directory.lab.invalid",
                       "sssd_ldap_search_base=dc=lab,dc=invalid", "sssd_ldap_start_tls=false", "sssd_ldap_bind_dn=",
                       "sssd_ldap_bind_password=", limit=CN)
    text = " ".join(res.stdout.split())
    assert res.returncode != 0, res.stdout[-3000:]
    assert "sssd-ldap, libnss-sss, libpam-sss: not in the archive of %s (Debian" % CN in text, text[-3000:]
    assert "forky), so none of sssd-ldap, libnss-sss, libpam-sss was installed" in text, text[-3000:]
    assert "converged_sssd false" in text, text[-3000:]
    assert lab.on(CN, "dpkg -s sssd-ldap", check=False).returncode != 0
    assert lab.on(CN, "test -e /etc/sssd/sssd.conf", check=False).returncode != 0


def test_slurmdbd_26_05_finds_mariadb_11_8_as_it_asks(lab):
    # MariaDB 11.8 has innodb_snapshot_isolation on, which slurmdbd 26.05 refuses (a write conflict would be
    # fatal): the mariadb role turns it off
    assert lab.on(CTL, "mariadb -N -e 'select @@innodb_snapshot_isolation'").stdout.strip() == "0"
    log = lab.on(CTL, "journalctl -u slurmdbd --no-pager -o cat").stdout
    assert "innodb_snapshot_isolation is enabled" not in log, log[-2000:]
