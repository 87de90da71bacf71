"""Shared storage and identity end to end in a lab of its own: nfs-ganesha on the controller
(the kernel here has no NFS), the compute nodes' fstab and slurmd ordering, the export
proven with libnfs tools from another machine; SSSD against the lab's slapd over ldaps://;
an MPI job submitted as an LDAP user whose program and output live in the shared home."""

import glob
import os
import re

import pytest

from labkit import Lab, has_podman

LAB = Lab("slab", "10.89.85", 16485, ".lab/storage", LAB_COMPUTE="2", LAB_DIRECTORY="1")
sh, on = LAB.sh, LAB.on
CTL, CN, CN2 = "slab-ctl-01", "slab-cn-01", "slab-cn-02"
NODES = [CTL, CN, CN2]

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    yield
    LAB.down()


def test_ganesha_serves_the_exports(lab):
    assert on(CTL, "systemctl is-active nfs-ganesha").stdout.strip() == "active"
    conf = on(CTL, "cat /etc/ganesha/ganesha.conf").stdout
    assert 'Path = "/srv/shared/home";' in conf and 'Path = "/srv/shared/slurm-state";' in conf
    assert on(CTL, "stat -c '%U %a' /srv/shared/home /srv/shared/home/alice").stdout.split("\n")[:2] == \
        ["root 755", "alice 700"]


def test_export_works_from_a_compute_node_with_libnfs(lab):
    on(CN, "echo written-over-nfs-by-%s > /tmp/probe.txt" % CN)
    on(CN, "nfs-cp /tmp/probe.txt nfs://%s/srv/shared/home/probe.txt" % CTL)
    assert on(CTL, "cat /srv/shared/home/probe.txt").stdout.strip() == "written-over-nfs-by-%s" % CN
    listing = on(CN, "nfs-ls nfs://%s/srv/shared/home" % CTL).stdout
    assert "probe.txt" in listing


def test_compute_node_fstab_and_slurmd_ordering(lab):
    fstab = on(CN, "cat /etc/fstab").stdout
    assert "10.89.85.11:/srv/shared/home /home nfs rw,hard,noatime,_netdev,vers=4.2 0 0" in fstab
    unit = on(CN, "systemctl show -p Wants -p After slurmd").stdout
    assert "home.mount" in unit.split("Wants=")[1].split("\n")[0] and "remote-fs.target" in unit
    # the lab uses wants (this kernel cannot mount); production's requires is RequiresMountsFor
    dropin = on(CN, "cat /etc/systemd/system/slurmd.service.d/converged-hpc-nfs.conf").stdout
    assert "Wants=home.mount" in dropin and "After=home.mount" in dropin
    assert on(CN, "systemctl is-active slurmd").stdout.strip() == "active"


def test_mounting_on_a_kernel_without_nfs_fails_clearly(lab):
    res = LAB.playbook("storage.yml", "nfs_client_state=mounted")
    assert res.returncode != 0
    assert "this kernel has no NFS client" in res.stdout
    assert "/home" not in on(CN, "findmnt -t nfs,nfs4 -n -o TARGET", check=False).stdout


def test_relative_export_path_fails_before_any_change(lab):
    before = on(CTL, "sha256sum /etc/ganesha/ganesha.conf").stdout
    res = LAB.playbook("storage.yml", '{"nfs_server_exports": [{"path": "srv/relative", "clients": "*"}]}')
    assert res.returncode != 0 and "export path 'srv/relative' is not an absolute path" in res.stdout
    assert on(CTL, "sha256sum /etc/ganesha/ganesha.conf").stdout == before


def test_directory_users_resolve_on_every_node(lab):
    for node in NODES:
        assert on(node, "getent passwd alice").stdout.strip() == "alice:*:5001:5000:Alice Lab:/home/alice:/bin/bash"
        assert on(node, "id bob").stdout.strip() == "uid=5002(bob) gid=5000(hpcusers) groups=5000(hpcusers)"
        assert on(node, "getent group hpcusers").stdout.strip() == "hpcusers:*:5000:alice,bob"
        assert on(node, "stat -c '%a %U:%G' /etc/sssd/sssd.conf").stdout.strip() == "600 root:root"
        conf = on(node, "cat /etc/sssd/sssd.conf").stdout
        assert "ldap_uri = ldaps://slab-dir" in conf and "ldap_tls_reqcert = demand" in conf
        assert on(node, "systemctl is-active sssd").stdout.strip() == "active"


def test_directory_refuses_anonymous_reads_and_plain_tls_without_the_ca(lab):
    # SSSD resolves users because it binds with its account over verified TLS, not by luck:
    anonymous = on(CN, "LDAPTLS_CACERT=/etc/sssd/converged-hpc-ldap-ca.crt ldapsearch -x -LLL "
                       "-H ldaps://slab-dir -b dc=hpc,dc=lab uid=alice dn", check=False)
    assert anonymous.stdout.strip() == "" and "No such object (32)" in anonymous.stderr
    untrusted = on(CN, "LDAPTLS_CACERT=/dev/null ldapsearch -x -H ldaps://slab-dir -b dc=hpc,dc=lab", check=False)
    assert untrusted.returncode != 0


MPI_HELLO = r"""
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size; char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    printf("rank %d of %d on %s as uid %d\n", rank, size, host, (int) getuid());
    MPI_Finalize();
    return 0;
}
"""

# The test bed's kernel cannot mount NFS, so the job reaches the shared home with libnfs
# (as its own uid, AUTH_SYS); in production ~ is the NFS mount and the job runs ~/mpi-hello.
JOB = """#!/bin/bash
#SBATCH --nodes=2 --ntasks-per-node=1 --chdir=/tmp --output=/tmp/mpi-alice-%j.log
set -euo pipefail
home=nfs://slab-ctl-01/srv/shared/home/alice
work=/tmp/mpi-alice-$SLURM_JOB_ID
mkdir -p "$work"
nfs-cp "$home/mpi-hello" "$work/mpi-hello"
chmod 0755 "$work/mpi-hello"
srun --mpi=pmi2 --bcast="/tmp/mpi-hello-bcast-$SLURM_JOB_ID" "$work/mpi-hello" > "$work/result.txt"
echo "job $SLURM_JOB_ID by $(id -un)" >> "$work/result.txt"
nfs-cp "$work/result.txt" "$home/mpi-hello-$SLURM_JOB_ID.out"
"""


def test_ldap_user_runs_an_mpi_job_from_and_into_the_shared_home(lab):
    on(CTL, "cat > /tmp/mpi-hello.c <<'EOF'\n%sEOF\ncat > /tmp/mpi-alice.sh <<'EOF'\n%sEOF\n"
            "chmod 0644 /tmp/mpi-hello.c /tmp/mpi-alice.sh" % (MPI_HELLO, JOB))
    # compiled as alice straight into her home on the NFS server
    on(CTL, "cd /tmp && runuser -u alice -- mpicc -o /srv/shared/home/alice/mpi-hello /tmp/mpi-hello.c")
    job = on(CTL, "cd /tmp && runuser -u alice -- timeout 180 sbatch --wait --parsable /tmp/mpi-alice.sh")
    job_id = job.stdout.strip()
    assert re.fullmatch(r"\d+", job_id), job.stdout
    record = on(CTL, "scontrol show job %s" % job_id).stdout
    assert "UserId=alice(5001)" in record and "JobState=COMPLETED" in record and "ExitCode=0:0" in record
    out = "/srv/shared/home/alice/mpi-hello-%s.out" % job_id
    # written over NFS by the job as alice: owned by her uid on the server
    assert on(CTL, "stat -c '%%U %%u' %s" % out).stdout.strip() == "alice 5001"
    lines = on(CTL, "cat %s" % out).stdout.strip().splitlines()
    ranks = sorted(lines[:-1])
    assert [line.split(" on ")[0] for line in ranks] == ["rank 0 of 2", "rank 1 of 2"], lines
    assert sorted(line.split(" on ")[1] for line in ranks) == ["%s as uid 5001" % CN, "%s as uid 5001" % CN2]
    assert lines[-1] == "job %s by alice" % job_id


def test_bad_ldap_uri_fails_before_any_change(lab):
    before = on(CN, "sha256sum /etc/sssd/sssd.conf").stdout
    res = LAB.playbook("identity.yml", "sssd_ldap_uri=http://slab-dir")
    assert res.returncode != 0
    assert "sssd_ldap_uri 'http://slab-dir' is not an ldap:// or ldaps:// URI" in res.stdout
    assert on(CN, "sha256sum /etc/sssd/sssd.conf").stdout == before


def test_missing_ca_file_with_tls_fails_before_any_change(lab):
    before = on(CN, "sha256sum /etc/sssd/sssd.conf").stdout
    res = LAB.playbook("identity.yml", "sssd_ldap_tls_cacert_src=/nonexistent/lab-ca.crt")
    assert res.returncode != 0
    assert "the CA file '/nonexistent/lab-ca.crt' (sssd_ldap_tls_cacert_src, on the Ansible controller) " \
           "does not exist" in res.stdout
    res = LAB.playbook("identity.yml", "sssd_ldap_tls_cacert_src=''", "sssd_ldap_tls_cacert=/etc/ssl/missing.crt")
    assert res.returncode != 0
    assert "the CA file '/etc/ssl/missing.crt' (sssd_ldap_tls_cacert, on slab-cn-01) does not exist" in res.stdout
    assert on(CN, "sha256sum /etc/sssd/sssd.conf").stdout == before


def test_identity_converge_is_idempotent(lab):
    res = LAB.playbook("identity.yml")
    assert res.returncode == 0, res.stdout[-2000:]
    recap = [line for line in res.stdout.splitlines() if " : ok=" in line]
    assert len(recap) == 3 and all("changed=0" in line for line in recap), recap


def test_bind_password_never_reaches_a_log(lab):
    with open(os.path.join(LAB.state, "directory", "bind.pw")) as f:
        secret = f.read().strip()
    with open(os.path.join(LAB.state, "directory", "admin.pw")) as f:
        admin = f.read().strip()
    logs = glob.glob(os.path.join(LAB.state, "logs", "*.log"))
    assert any(p.endswith("site.log") for p in logs) and any(p.endswith("directory.log") for p in logs)
    for path in logs:
        with open(path, errors="replace") as f:
            text = f.read()
        assert secret not in text and admin not in text, path
    # a run that changes sssd.conf, verbose and with --diff, shows no secret either
    inv = os.path.join(LAB.state, "capi.capi_machines.yml")
    changed = sh("ansible-playbook", "-v", "--diff", "-i", inv, "playbooks/identity.yml",
                 "-e", '{"sssd_domain_extra_options": {"entry_cache_timeout": 601}}')
    assert "changed=2" in changed.stdout  # sssd.conf and the restart, on each host
    assert secret not in changed.stdout + changed.stderr
    assert "entry_cache_timeout = 601" in on(CN, "cat /etc/sssd/sssd.conf").stdout
    sh("ansible-playbook", "-i", inv, "playbooks/identity.yml")
    assert "entry_cache_timeout" not in on(CN, "cat /etc/sssd/sssd.conf").stdout
