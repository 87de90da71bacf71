"""Shared storage and identity end to end in a lab of its own: nfs-ganesha on the controller
(the kernel here has no NFS), the compute nodes' fstab and slurmd ordering, the export
proven with libnfs tools from another machine; SSSD against the lab's slapd over ldaps://;
an MPI job submitted as an LDAP user whose program and output live in the shared home;
accounting (slurmdbd on MariaDB on the controller: every job's record through sacct, a
backup that restores) and slurmrestd (a job submitted over REST with alice's token, a
wrong token and none refused); bad accounting and REST input failing before any change."""

import glob
import json
import os
import re
import subprocess
import time

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


@pytest.mark.gate
def test_ganesha_serves_the_exports(lab):
    assert on(CTL, "systemctl is-active nfs-ganesha").stdout.strip() == "active"
    conf = on(CTL, "cat /etc/ganesha/ganesha.conf").stdout
    assert 'Path = "/srv/shared/home";' in conf and 'Path = "/srv/shared/slurm-state";' in conf
    assert on(CTL, "stat -c '%U %a' /srv/shared/home /srv/shared/home/alice").stdout.split("\n")[:2] == \
        ["root 755", "alice 700"]


@pytest.mark.gate
def test_export_works_from_a_compute_node_with_libnfs(lab):
    on(CN, "echo written-over-nfs-by-%s > /tmp/probe.txt" % CN)
    on(CN, "nfs-cp /tmp/probe.txt nfs://%s/srv/shared/home/probe.txt" % CTL)
    assert on(CTL, "cat /srv/shared/home/probe.txt").stdout.strip() == "written-over-nfs-by-%s" % CN
    listing = on(CN, "nfs-ls nfs://%s/srv/shared/home" % CTL).stdout
    assert "probe.txt" in listing


@pytest.mark.gate
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


@pytest.mark.gate
def test_directory_users_resolve_on_every_node(lab):
    for node in NODES:
        assert on(node, "getent passwd alice").stdout.strip() == "alice:*:5001:5000:Alice Lab:/home/alice:/bin/bash"
        assert on(node, "id bob").stdout.strip() == "uid=5002(bob) gid=5000(hpcusers) groups=5000(hpcusers)"
        assert on(node, "getent group hpcusers").stdout.strip() == "hpcusers:*:5000:alice,bob"
        assert on(node, "stat -c '%a %U:%G' /etc/sssd/sssd.conf").stdout.strip() == \
            "%s root:root" % LAB.sssd_conf_mode(node)
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


@pytest.mark.gate
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


@pytest.mark.gate
def test_identity_converge_is_idempotent(lab):
    res = LAB.playbook("identity.yml")
    assert res.returncode == 0, res.stdout[-2000:]
    recap = [line for line in res.stdout.splitlines() if " : ok=" in line]
    assert len(recap) == 3 and all("changed=0" in line for line in recap), recap


def assert_absent_from_logs(*secrets):
    """None of the secrets in any of the lab's logs; the logs it read."""
    logs = glob.glob(os.path.join(LAB.state, "logs", "*.log"))
    for path in logs:
        with open(path, errors="replace") as f:
            text = f.read()
        assert not [s for s in secrets if s in text], path
    return logs


def verbose_diff_run(playbook, extra):
    """A verbose run with --diff of a playbook, with extra vars that change a file: its output."""
    inv = os.path.join(LAB.state, "capi.capi_machines.yml")
    return sh("ansible-playbook", "-v", "--diff", "-i", inv, "playbooks/" + playbook, "-e", extra)


def converge_again(playbook):
    sh("ansible-playbook", "-i", os.path.join(LAB.state, "capi.capi_machines.yml"), "playbooks/" + playbook)


def test_bind_password_never_reaches_a_log(lab):
    with open(os.path.join(LAB.state, "directory", "bind.pw")) as f:
        secret = f.read().strip()
    with open(os.path.join(LAB.state, "directory", "admin.pw")) as f:
        admin = f.read().strip()
    logs = assert_absent_from_logs(secret, admin)
    assert any(p.endswith("site.log") for p in logs) and any(p.endswith("directory.log") for p in logs)
    # a run that changes sssd.conf, verbose and with --diff, shows no secret either
    changed = verbose_diff_run("identity.yml", '{"sssd_domain_extra_options": {"entry_cache_timeout": 601}}')
    assert "changed=2" in changed.stdout  # sssd.conf and the restart, on each host
    assert secret not in changed.stdout + changed.stderr
    assert "entry_cache_timeout = 601" in on(CN, "cat /etc/sssd/sssd.conf").stdout
    converge_again("identity.yml")
    assert "entry_cache_timeout" not in on(CN, "cat /etc/sssd/sssd.conf").stdout


# ------------------------------------------------------------------ accounting and REST
REST_CALL = r"""
import json, sys, urllib.error, urllib.request
path, user, token, body = sys.argv[1], sys.argv[2], sys.stdin.read().strip(), sys.argv[3]
headers = {"X-SLURM-USER-NAME": user, "Content-Type": "application/json"}
if token:
    headers["X-SLURM-USER-TOKEN"] = token
req = urllib.request.Request("http://127.0.0.1:6820" + path, data=body.encode() if body else None, headers=headers)
try:
    with urllib.request.urlopen(req) as r:
        status, text = r.status, r.read().decode()
except urllib.error.HTTPError as e:
    status, text = e.code, e.read().decode()
print(json.dumps({"status": status, "body": text}))
"""


def token(user):
    return on(CTL, "scontrol token username=%s lifespan=300" % user).stdout.strip().split("=", 1)[1]


def rest(path, user, tok, body=None):
    """Call slurmrestd on the controller; the token goes through stdin, never a command line."""
    proc = subprocess.run(["podman", "exec", "-i", CTL, "python3", "-c", REST_CALL, path, user,
                           json.dumps(body) if body else ""],
                          input=tok or "", capture_output=True, text=True, env=LAB.env, check=True)
    answer = json.loads(proc.stdout)
    try:
        answer["json"] = json.loads(answer["body"])
    except ValueError:
        answer["json"] = {}
    return answer


def sacct(job):
    out = on(CTL, "sacct --noheader --parsable2 --allocations --jobs %s --format JobID,User,State,ExitCode" % job)
    return out.stdout.strip()


# the REST API of each Slurm release the lab runs, and how it refuses a wrong token: slurmctld refuses
# it, slurmrestd answers 500 (22.05) or 511 "Protocol authentication error" (24.11) with no data
REST_API = {"22.05": ("v0.0.38", 500), "24.11": ("v0.0.42", 511)}


def rest_api():
    return REST_API[LAB.slurm_release(CTL)]


def submit_body(api, name, script):
    """A job submission as the API version takes it (v0.0.38: the script beside the job, the environment a
    mapping; from v0.0.40: inside the job, a list)."""
    if api == "v0.0.38":
        return {"job": {"name": name, "nodes": 1, "current_working_directory": "/tmp",
                        "environment": {"PATH": "/bin:/usr/bin"}}, "script": script}
    return {"job": {"name": name, "nodes": "1", "current_working_directory": "/tmp",
                    "environment": ["PATH=/bin:/usr/bin"], "script": script}}


@pytest.mark.gate
def test_a_job_submitted_over_rest_runs_as_alice_and_is_accounted(lab):
    api, _refused = rest_api()
    tok = token("alice")
    ping = rest("/slurm/%s/ping" % api, "alice", tok)
    # v0.0.38 (22.05) names it "ping", v0.0.40 and later "pinged"
    first = ping["json"]["pings"][0] if ping["status"] == 200 else {}
    assert first.get("pinged", first.get("ping")) == "UP", ping
    sub = rest("/slurm/%s/job/submit" % api, "alice", tok, submit_body(api, "rest-alice", "#!/bin/bash\nid -un\n"))
    assert sub["status"] == 200 and sub["json"]["errors"] == [], sub
    job = sub["json"]["job_id"]
    deadline = time.time() + 120
    while sacct(job) != "%s|alice|COMPLETED|0:0" % job:
        assert time.time() < deadline, sacct(job)
        time.sleep(1)
    # the accounting side of the API sees it too (its "user" is the association's: alice has none
    # in accounting, no AccountingStorageEnforce; sacct above names her from the job's uid)
    rec = rest("/slurmdb/%s/job/%s" % (api, job), "alice", tok)
    states = [(j["job_id"], j["state"]["current"]) for j in rec["json"]["jobs"]]
    assert rec["status"] == 200 and states in ([(job, "COMPLETED")], [(job, ["COMPLETED"])]), rec


@pytest.mark.gate
def test_a_wrong_token_and_no_token_are_refused(lab):
    api, refused = rest_api()
    good = token("alice")
    forged = good[:-6] + ("AAAAAA" if not good.endswith("AAAAAA") else "BBBBBB")  # alice's token, signature broken
    for tok in (forged, "eyJhbGciOiJIUzI1NiJ9.e30.x"):
        answer = rest("/slurm/%s/jobs" % api, "alice", tok)
        # slurmctld refuses the token: slurmrestd answers with the error and no data
        assert answer["status"] == refused and answer["json"]["errors"] and not answer["json"].get("jobs"), answer
    assert rest("/slurm/%s/jobs" % api, "alice", None)["status"] == 401
    # a token for bob does not act as alice
    assert rest("/slurm/%s/jobs" % api, "alice", token("bob"))["status"] == refused
    assert "auth_p_verify" in on(CTL, "tail -n 50 /var/log/slurm/slurmctld.log").stdout


@pytest.mark.gate
def test_every_job_of_this_lab_has_a_final_record(lab):
    out = on(CTL, "sacct --noheader --parsable2 --allocations --allusers --starttime 2000-01-01 "
                  "--format JobID,User,State,ExitCode").stdout.strip().splitlines()
    jobs = [line.split("|") for line in out]
    assert len(jobs) >= 3, out  # validate.yml's, alice's MPI job, the REST job
    assert all(rec[2:] == ["COMPLETED", "0:0"] for rec in jobs), out
    assert {"alice", "root"} <= {rec[1] for rec in jobs}


def test_accounting_backup_dumps_a_database_that_restores(lab, tmp_path):
    res = LAB.playbook("accounting_backup.yml", "slurmdbd_backup_fetch_dir=%s" % tmp_path)
    assert res.returncode == 0, res.stdout[-3000:]
    dumps = sorted(tmp_path.glob("slurm_acct_db-*.sql.gz"))
    assert len(dumps) == 1 and dumps[0].stat().st_size > 1000
    remote = "/var/backups/slurm-accounting/" + dumps[0].name
    assert on(CTL, "stat -c '%a %U' /var/backups/slurm-accounting").stdout.strip() == "700 root"
    # restore into a scratch database: the same jobs as the live one
    on(CTL, "mariadb -e 'DROP DATABASE IF EXISTS restore_check; CREATE DATABASE restore_check' && "
            "zcat %s | mariadb restore_check" % remote)
    count = "mariadb -N -e 'SELECT COUNT(*) FROM %s.slab_job_table'"
    live, restored = on(CTL, count % "slurm_acct_db").stdout.strip(), on(CTL, count % "restore_check").stdout.strip()
    assert int(live) >= 3 and restored == live
    on(CTL, "mariadb -e 'DROP DATABASE restore_check'")


@pytest.mark.gate
def test_bad_accounting_and_rest_input_fails_before_any_change(lab):
    files = "/etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf /etc/systemd/system/slurmrestd.service.d/converged-hpc.conf"
    before = on(CTL, "sha256sum " + files).stdout
    cases = [
        (["slurmdbd_storage_password=''"],
         "accounting is on (converged_accounting) but slurmdbd_storage_password is empty"),
        (["converged_accounting_node_type=login"],
         "accounting is on (converged_accounting) but no host can run slurmdbd: node type login has no Machine"),
        (['{"slurmrestd_listen": [":22"]}'],
         "slurmrestd_listen: port(s) 22 on slab-ctl-01 already in use by sshd"),
    ]
    for extra, message in cases:
        res = LAB.playbook("site.yml", *extra)
        assert res.returncode != 0 and message in res.stdout, (extra, res.stdout[-2000:])
        recap = [line for line in res.stdout.splitlines() if " : ok=" in line]
        assert recap and all("changed=0" in line for line in recap), recap
    assert on(CTL, "sha256sum " + files).stdout == before


def test_database_password_and_jwt_key_never_reach_a_log(lab):
    with open(os.path.join(LAB.state, "capi", "slurmdbd.pw")) as f:
        password = f.read().strip()
    key = on(CTL, "cat /etc/slurm/jwt_hs256.key").stdout.strip()
    assert len(password) >= 20 and len(key) == 96
    assert on(CTL, "stat -c '%a %U' /etc/slurm/jwt_hs256.key /etc/slurm/slurmdbd.conf").stdout.split("\n")[:2] == \
        ["600 slurm", "600 slurm"]
    assert password in on(CTL, "cat /etc/slurm/slurmdbd.conf").stdout  # the test looks for the real thing
    assert_absent_from_logs(password, key)
    # a verbose run with --diff that changes slurmdbd.conf shows neither
    changed = verbose_diff_run("site.yml", '{"slurmdbd_extra_config": {"DebugLevel": "verbose"}}')
    assert "DebugLevel=verbose" in on(CTL, "cat /etc/slurm/slurmdbd.conf").stdout
    assert password not in changed.stdout + changed.stderr and key not in changed.stdout + changed.stderr
    converge_again("site.yml")
    assert "DebugLevel" not in on(CTL, "cat /etc/slurm/slurmdbd.conf").stdout
