"""A converged 1 + 2 cluster: daemons, files and modes, dynamic nodes IDLE, a real job on both nodes."""

import re
import time

import pytest

CTL = "mol-cluster-ctl"
NODES = ["mol-cluster-cn1", "mol-cluster-cn2"]
# podman exec straight into the machines: much faster than one ansible run per command
testinfra_hosts = ["podman://" + name for name in [CTL] + NODES]


def test_munge_key_and_daemon(host):
    key = host.file("/etc/munge/munge.key")
    assert key.user == "munge" and key.group == "munge" and key.mode == 0o400
    assert key.size == 48
    assert host.service("munge").is_running and host.service("munge").is_enabled


def test_role_daemons(host):
    name = host.backend.get_hostname()
    if name == CTL:
        assert host.service("slurmctld").is_running and host.service("slurmctld").is_enabled
        conf = host.file("/etc/slurm/slurm.conf")
        assert conf.mode == 0o644 and conf.user == "root"
        text = conf.content_string
        for line in ("SelectType=select/cons_tres", "SlurmctldParameters=enable_configless",
                     "NodeSet=computeset Feature=compute", "ClusterName=molecule"):
            assert line in text
        version = host.check_output("slurmctld -V").split()[-1]
        # dynamic nodes need TreeWidth=65533 before 23.11 only
        assert ("TreeWidth=65533" in text) == version.startswith("22.05")
        # dynamic nodes only; on 24.11.0-24.11.5 placeholders that never run anything
        nodes = [line for line in text.splitlines() if line.startswith("NodeName=")]
        if version.startswith("24.11.") and int(version.split(".")[2]) < 6:
            assert nodes == ["NodeName=computeset-future-[1-32] State=FUTURE Feature=compute Sockets=1 "
                             "CoresPerSocket=1024 ThreadsPerCore=1 RealMemory=4194304"]
            assert "MaxNodeCount=1056" in text
        else:
            assert nodes == []
        assert host.file("/etc/slurm/cgroup.conf").exists
        assert host.socket("tcp://0.0.0.0:6817").is_listening
    else:
        assert host.service("slurmd").is_running and host.service("slurmd").is_enabled
        # a dynamic node registering under the contract's node name
        assert "-Z -N %s --conf-server" % name in host.file("/etc/default/slurmd").content_string
        assert not host.file("/etc/slurm/slurm.conf").exists  # configless
        assert host.file("/run/slurm/conf/slurm.conf").exists  # fetched from the controller


def test_nodes_idle_with_declared_hardware(host):
    if host.backend.get_hostname() != CTL:
        pytest.skip("asked on the controller")
    for node in NODES:
        out = host.check_output("scontrol show node --oneliner %s", node)
        assert re.search(r"State=IDLE\+DYNAMIC_NORM", out), out
    cn1 = host.check_output("scontrol show node --oneliner mol-cluster-cn1")
    assert "RealMemory=1500" in cn1 and "CPUTot=2" in cn1
    assert "AvailableFeatures=compute,bigmem" in cn1
    cn2 = host.check_output("scontrol show node --oneliner mol-cluster-cn2")
    assert "AvailableFeatures=compute " in cn2


def test_a_killed_slurmd_comes_back_and_registers_again(host):
    # placed before the jobs below: they run on both nodes, so cn2 must be IDLE again
    if host.backend.get_hostname() != "mol-cluster-cn2":
        pytest.skip("done on one node")
    assert "Restart=on-failure" in host.check_output("systemctl cat slurmd")

    def record():
        return host.run("scontrol show node --oneliner mol-cluster-cn2").stdout

    def started(out):
        found = re.search(r"SlurmdStartTime=(\S+)", out)
        return found.group(1) if found else None

    before = started(record())
    assert before, record()
    time.sleep(1.1)  # SlurmdStartTime counts whole seconds
    host.run_expect([0], "pkill -KILL -x slurmd")
    # systemd starts it again after slurm_compute_restart_sec (5 s); it registers again, IDLE
    out = ""
    for attempt in range(90):
        out = record()
        if started(out) not in (None, before) and re.search(r"State=IDLE\+DYNAMIC_NORM ", out):
            break
        time.sleep(1)
    else:
        raise AssertionError("slurmd killed: not registered again and IDLE after 90 s:\n%s\n%s"
                             % (out, host.run("systemctl status slurmd").stdout))


def test_a_real_job_ran_on_both_nodes(host):
    if host.backend.get_hostname() != CTL:
        pytest.skip("asked on the controller")
    job = host.check_output(
        "sbatch --parsable --wait --nodes=2 --output=/tmp/verify-%j.out --wrap 'srun hostname --short'")
    state = host.check_output("scontrol show job %s", job.strip())
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state
    batch_host = re.search(r"BatchHost=(\S+)", state).group(1)
    # the output file is on the job's batch host (no shared storage in this scenario)
    out = host.check_output("srun --nodelist=%s cat /tmp/verify-%s.out", batch_host, job.strip())
    assert sorted(out.split()) == NODES


def test_the_node_check_passes_live_nodes_and_names_a_silent_one(host):
    # the role's PrologSlurmctld, run as slurmctld runs it (as SlurmUser, the job's node list in its environment)
    if host.backend.get_hostname() != CTL:
        pytest.skip("asked on the controller")
    conf = host.file("/etc/slurm/slurm.conf").content_string
    script = re.search(r"^PrologSlurmctld=(\S+)$", conf, re.M).group(1)
    run = "runuser -u slurm -- env SLURM_JOB_ID=7 SLURM_JOB_NODELIST=%s " + script
    live = host.run(run, "mol-cluster-cn[1-2]")
    assert live.rc == 0, live.stderr
    # a node that does not answer (a name nothing resolves, as a machine gone from the network): exit 1, named
    silent = host.run(run, "mol-cluster-cn1,mol-cluster-gone")
    assert silent.rc == 1 and "from mol-cluster-gone:" in silent.stderr, (silent.rc, silent.stderr)
    assert "mol-cluster-cn1" not in silent.stderr


def test_munge_credentials_decode_across_nodes(host):
    if host.backend.get_hostname() != CTL:
        pytest.skip("asked on the controller")
    cred = host.check_output("munge --no-input")
    # the controller's credential, decoded on each compute node
    out = host.check_output("srun --nodes=2 --ntasks=2 bash -c 'echo %s | unmunge >/dev/null && hostname -s'"
                            % cred)
    assert sorted(out.split()) == NODES


def test_mpi_hello_world_on_both_nodes_with_pmi2(host):
    if host.backend.get_hostname() != CTL:
        pytest.skip("asked on the controller")
    src = ("#include <mpi.h>\n#include <stdio.h>\n#include <unistd.h>\n"
           "int main(int c, char **v) { int r, s; char h[64]; MPI_Init(&c, &v);"
           " MPI_Comm_rank(MPI_COMM_WORLD, &r); MPI_Comm_size(MPI_COMM_WORLD, &s); gethostname(h, 64);"
           " printf(\"rank %d of %d on %s\\n\", r, s, h); MPI_Finalize(); return 0; }\n")
    host.check_output("printf '%%s' %s > /tmp/hello.c && mpicc -o /tmp/hello /tmp/hello.c", src)
    out = host.check_output("srun --mpi=pmi2 --nodes=2 --ntasks=2 --ntasks-per-node=1 --bcast=/tmp/hello-b "
                            "/tmp/hello")
    lines = sorted(out.splitlines())
    assert lines == ["rank %d of 2 on %s" % (i, n) for i, n in enumerate(NODES)] or \
        sorted(line.split()[-1] for line in lines) == NODES


JWT_KEY = "/etc/slurm/jwt_hs256.key"


def test_accounting_and_rest_daemons_files_and_modes(host):
    name = host.backend.get_hostname()
    if name != CTL:
        # tokens are checked by slurmctld and slurmdbd only: the key is nowhere else
        assert not host.file(JWT_KEY).exists
        return
    for unit in ("mariadb", "slurmdbd", "slurmrestd"):
        assert host.service(unit).is_running and host.service(unit).is_enabled, unit
    for path in ("/etc/slurm/slurmdbd.conf", JWT_KEY):
        f = host.file(path)
        assert (f.user, f.group, f.mode) == ("slurm", "slurm", 0o600), path
    # the key came from slurm_common_jwt_key, byte for byte
    assert len(host.file(JWT_KEY).content_string) == 64
    conf = host.file("/etc/slurm/slurm.conf").content_string
    for line in ("AccountingStorageType=accounting_storage/slurmdbd", "AccountingStoragePort=6819",
                 "AuthAltTypes=auth/jwt", "AuthAltParameters=jwt_key=" + JWT_KEY):
        assert line in conf, line
    # the database only on loopback; slurmdbd and slurmrestd on their ports
    assert host.socket("tcp://127.0.0.1:3306").is_listening and not host.socket("tcp://0.0.0.0:3306").is_listening
    assert host.socket("tcp://0.0.0.0:6819").is_listening and host.socket("tcp://0.0.0.0:6820").is_listening
    # slurmrestd never as root or SlurmUser
    pid = host.check_output("systemctl show -p MainPID --value slurmrestd")
    assert host.check_output("ps -o user= -p %s", pid).strip() == "slurmrestd"
    assert "molecule" in host.check_output("sacctmgr --noheader --parsable2 list cluster format=Cluster").split()


def test_a_finished_job_is_in_accounting_and_in_the_rest_api(host):
    if host.backend.get_hostname() != CTL:
        pytest.skip("asked on the controller")
    job = host.check_output("sbatch --parsable --wait --nodes=2 --wrap 'srun true'").strip()
    record, tries = "", 30
    while tries and not record.startswith("%s|COMPLETED" % job):  # slurmctld sends it soon after the job ends
        record = host.check_output("sacct --noheader --parsable2 --allocations --jobs %s --format JobID,State,ExitCode", job)
        tries -= 1
        host.run("sleep 1")
    assert record.split("\n")[0] == "%s|COMPLETED|0:0" % job
    token = host.check_output("scontrol token username=root lifespan=60").split("=", 1)[1]
    # the REST API of the release the scenario runs (22.05: v0.0.38, a state; 24.11: v0.0.42, a list of states)
    release = ".".join(host.check_output("sinfo -V").split()[-1].split(".")[:2])
    api, state = {"22.05": ("v0.0.38", '"COMPLETED"'), "24.11": ("v0.0.42", '["COMPLETED"]')}[release]
    probe = ("python3 -c 'import json,sys,urllib.request as u;"
             "r=u.urlopen(u.Request(\"http://127.0.0.1:6820/slurmdb/%s/job/%s\","
             "headers={\"X-SLURM-USER-NAME\":\"root\",\"X-SLURM-USER-TOKEN\":sys.argv[1]}));"
             "print(json.dumps([(j[\"job_id\"], j[\"state\"][\"current\"]) for j in json.load(r)[\"jobs\"]]))' %s")
    answer = host.check_output(probe % (api, job, token))
    assert answer == "[[%s, %s]]" % (job, state)
