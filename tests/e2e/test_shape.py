"""A real cluster's shape end to end, in a lab of its own: a login node that is a submit host
(never a Slurm node), a GPU node whose Machine declares two fake GPUs with the GRES annotation,
a highmem node, each compute kind fed by its own MachineDeployment into its own partition
(compute, gpu, highmem); hardware as slurmd detects it with memory kept for the OS
(MemSpecLimit); a GPU node added by scaling its MachineDeployment; the highmem nodes' MachineDeployment
scaled up and down (its leaving Machine held by our hook); bad declarations
failing before any change; a compute node that joins at its first boot with the directory's
users (playbooks/join_at_boot.yml), a GPU MachineDeployment refused for it."""

import base64
import os
import re
import time

import pytest

from labkit import Lab, has_podman, machine_of

# two compute hosts, and one spare GPU and highmem host each (LAB_SPARE_HOSTS): each scale-up claims the one host
# left (Cluster API's CAPM3 picks among the hosts its selector matches at random)
LAB = Lab("hlab", "10.89.88", 16488, ".lab/e2e-shape", LAB_COMPUTE="1", LAB_LOGIN="1", LAB_GPU="1",
          LAB_HIGHMEM="1", LAB_DIRECTORY="1", LAB_COMPUTE_HOSTS="2")
sh, on = LAB.sh, LAB.on
CTL, CN, GPU, HM, LOGIN = "hlab-ctl-01", "hlab-cn-01", "hlab-gpu-01", "hlab-hm-01", "hlab-login-01"
GRES_ANNOTATION = "slurm.converged.hpc/gres"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    yield
    LAB.down()


def api_client():
    from kubernetes import config
    return config.new_client_from_config(os.path.join(LAB.state, "capi", "kubeconfig"))


def kube():
    from kubernetes import client
    return client.CustomObjectsApi(api_client())


def machine_name(host):
    return machine_of(kube(), host)["metadata"]["name"]


def annotate_machine(host, value):
    """Declare the host's GRES as a site does: on its MachineDeployment's template. Cluster API puts a
    template's annotations on its Machines in place (the MachineSet controller, by server-side apply: a
    value written on the Machine itself is put back), without a rollout."""
    machine = machine_of(kube(), host)
    md = machine["metadata"]["labels"]["cluster.x-k8s.io/deployment-name"]
    kube().patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", md,
                                          {"spec": {"template": {"metadata": {"annotations": {GRES_ANNOTATION: value}}}}})
    deadline = time.time() + 60
    while (machine_of(kube(), host)["metadata"].get("annotations") or {}).get(GRES_ANNOTATION) != value:
        assert time.time() < deadline, "Cluster API did not put %s=%s on %s's Machine" % (GRES_ANNOTATION, value, host)
        time.sleep(0.5)


def job_state(job_id):
    return on(CTL, "scontrol show job %s" % job_id).stdout


def wait_gone_from_queue(job_id, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not on(CTL, "squeue -h -j %s -o %%T" % job_id, check=False).stdout.strip():
            return
        time.sleep(1)
    raise AssertionError("job %s still queued after %d s" % (job_id, timeout))


def test_each_node_type_feeds_its_own_partition(lab):
    rows = on(CTL, "sinfo --noheader --format '%P %D %N %t'").stdout.split("\n")
    assert [r.split() for r in rows if r.strip()] == [
        ["compute*", "1", CN, "idle"], ["gpu", "1", GPU, "idle"], ["highmem", "1", HM, "idle"]]
    conf = on(CTL, "cat /etc/slurm/slurm.conf").stdout
    for line in ("NodeSet=computeset Feature=compute", "NodeSet=gpuset Feature=gpu",
                 "NodeSet=highmemset Feature=highmem", "PartitionName=gpu Nodes=gpuset",
                 "PartitionName=highmem Nodes=highmemset", "GresTypes=gpu"):
        assert line in conf, line


def test_validate_reports_partitions_gres_and_login_submit(lab):
    log = open(os.path.join(LAB.state, "logs", "validate.log")).read()
    assert "partitions: compute* (%s: srun hostname answered); gpu (%s: srun hostname answered); " \
           "highmem (%s: srun hostname answered)" % (CN, GPU, HM) in log
    assert "GRES: %s gpu:lab:2 (job saw GPUs 0,1)" % GPU in log
    assert re.search(r"login nodes: %s submitted job \d+ \(COMPLETED\)" % LOGIN, log)


def placeholders():
    """Whether slurm.conf has placeholder nodes (Slurm 24.11.0 - 24.11.5, docs/releases.md)."""
    return on(CTL, "grep -c 'State=FUTURE' /etc/slurm/slurm.conf", check=False).stdout.strip() not in ("", "0")


def test_a_gpu_job_is_bound_to_the_gpus_it_asked_for(lab):
    # gres.conf comes from the Machine's annotation, served to the node by configless
    assert on(CTL, "grep ^NodeName /etc/slurm/gres.conf").stdout.strip() == \
        "NodeName=%s Name=gpu Type=lab File=/dev/nvidia[0-1]" % GPU
    assert "Gres=gpu:lab:2" in on(CTL, "scontrol show node %s" % GPU).stdout
    assert on(CTL, "srun -p gpu --gres=gpu:2 printenv CUDA_VISIBLE_DEVICES").stdout.strip() == "0,1"
    assert on(CTL, "srun -p gpu --gres=gpu:1 printenv CUDA_VISIBLE_DEVICES").stdout.strip() == "0"
    # a node without GPUs can never run it: refused at submission
    res = on(CTL, "sbatch -p compute --gres=gpu:1 --wrap hostname", check=False)
    assert res.returncode != 0 and "Requested node configuration is not available" in res.stderr
    # while a job holds both GPUs the next one waits for them; two GPU nodes wait for the pool to grow
    holder = on(CTL, "sbatch --parsable -p gpu --gres=gpu:2 --wrap 'sleep 60'").stdout.strip()
    waiter = on(CTL, "sbatch --parsable -p gpu --gres=gpu:1 --wrap hostname").stdout.strip()
    wide = on(CTL, "sbatch --parsable -p gpu -N 2 --gres=gpu:1 --wrap hostname").stdout.strip()
    # the partition's nodes are too few: PartitionNodeLimit; where placeholder nodes stand for the ones
    # to come (docs/releases.md) the partition is big enough and the nodes not there: ReqNodeNotAvail
    short = "ReqNodeNotAvail" if placeholders() else "PartitionNodeLimit"
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            reasons = on(CTL, "squeue -h -j %s,%s,%s -o '%%i %%T %%r'" % (holder, waiter, wide)).stdout
            if "%s RUNNING" % holder in reasons and "%s PENDING Resources" % waiter in reasons \
                    and "%s PENDING %s" % (wide, short) in reasons:
                break
            time.sleep(1)
        assert "%s PENDING Resources" % waiter in reasons and "%s PENDING %s" % (wide, short) in reasons, reasons
    finally:
        on(CTL, "scancel %s %s %s" % (holder, waiter, wide), check=False)


def test_highmem_jobs_land_on_the_highmem_node_and_memory_is_kept_for_the_os(lab):
    job = on(CTL, "sbatch --parsable --wait -p highmem --mem=3000 --output=/dev/null --wrap hostname").stdout.strip()
    assert "NodeList=%s" % HM in job_state(job) and "JobState=COMPLETED" in job_state(job)
    # compute nodes have 2000 MiB and keep 256: 3000 fits only highmem - refused at submission, or, where
    # placeholder nodes stand for the compute nodes to come (as large as any machine may be), taken to
    # wait for one that has it
    too_big(on(CTL, "sbatch --parsable -p compute --mem=3000 --wrap hostname", check=False),
            "Memory specification can not be satisfied")
    # highmem declares 4000 MiB, 256 kept for the OS (MemSpecLimit): 3800 cannot be had
    node = on(CTL, "scontrol show node %s" % HM).stdout
    assert "RealMemory=4000" in node and "MemSpecLimit=256" in node
    too_big(on(CTL, "sbatch --parsable -p highmem --mem=3800 --wrap hostname", check=False), "")


def too_big(res, error):
    """A job no node of its partition can run: refused at submission, or, where placeholder nodes stand
    for the nodes to come (as large as any machine may be, docs/releases.md), taken to wait for one."""
    if not placeholders():
        assert res.returncode != 0 and error in res.stderr, res.stderr
        return
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip()
    try:
        deadline = time.time() + 30
        while "JobState=PENDING Reason=None" in job_state(job):  # until the scheduler has looked
            assert time.time() < deadline, job_state(job)
            time.sleep(1)
        assert "JobState=PENDING" in job_state(job), job_state(job)
    finally:
        on(CTL, "scancel %s" % job, check=False)


def test_sockets_cores_and_threads_are_what_slurmd_detects(lab):
    for node in (CN, GPU, HM):
        detected = on(node, "slurmd -C").stdout
        want = {k: re.search(r"\b%s=(\d+)" % k, detected).group(1)
                for k in ("CPUs", "CoresPerSocket", "ThreadsPerCore")}
        want["Sockets"] = re.search(r"\bSocketsPerBoard=(\d+)", detected).group(1)
        record = on(CTL, "scontrol show node %s" % node).stdout
        for key, value in (("CPUTot", want["CPUs"]), ("Sockets", want["Sockets"]),
                           ("CoresPerSocket", want["CoresPerSocket"]), ("ThreadsPerCore", want["ThreadsPerCore"])):
            assert re.search(r"\b%s=%s\b" % (key, value), record), (node, key, value, record)
        # nothing declared that would override the detection
        options = on(node, "cat /etc/default/slurmd").stdout
        assert "Sockets=" not in options and "CoresPerSocket=" not in options and "CPUs=" not in options


MPI_HELLO = r"""#include <mpi.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int rank, size; char host[256];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    gethostname(host, sizeof host);
    printf("rank %d of %d on %s\n", rank, size, host);
    MPI_Finalize();
    return 0;
}
"""

# The test bed's kernel cannot mount NFS: the program and the output travel through alice's
# home on the NFS server with libnfs, as her own uid; in production ~ is the NFS mount.
JOB = """#!/bin/bash
#SBATCH --partition=compute --nodes=1 --ntasks=2 --chdir=/tmp --output=/tmp/login-mpi-%j.log
set -euo pipefail
home=nfs://hlab-ctl-01/srv/shared/home/alice
work=/tmp/login-mpi-$SLURM_JOB_ID
mkdir -p "$work"
nfs-cp "$home/mpi-hello" "$work/mpi-hello"
chmod 0755 "$work/mpi-hello"
srun --mpi=pmi2 "$work/mpi-hello" > "$work/result.txt"
echo "job $SLURM_JOB_ID by $(id -un)" >> "$work/result.txt"
nfs-cp "$work/result.txt" "$home/login-mpi-$SLURM_JOB_ID.out"
"""


def test_login_node_is_a_submit_host_and_never_a_slurm_node(lab):
    assert on(LOGIN, "systemctl is-active slurmd", check=False).stdout.strip() != "active"
    # one image for every node may carry slurmd: never enabled here
    assert on(LOGIN, "systemctl is-enabled slurmd", check=False).stdout.strip() in ("disabled", "")
    assert LOGIN not in on(CTL, "sinfo --noheader --Node --format %N").stdout
    if LAB.slurm_release(CTL) == "22.05":
        # no sackd: the controller's own slurm.conf, every SlurmctldHost, the cluster name, auth
        assert on(LOGIN, "sha256sum < /etc/slurm/slurm.conf").stdout == \
            on(CTL, "sha256sum < /etc/slurm/slurm.conf").stdout
    else:
        # sackd, a configless client: the controller's configuration fetched, no slurm.conf of its own
        assert on(LOGIN, "systemctl is-active sackd").stdout.strip() == "active"
        assert on(LOGIN, "test -e /etc/slurm/slurm.conf", check=False).returncode != 0
        assert on(LOGIN, "grep -c ^SlurmctldHost /run/slurm/conf/slurm.conf").stdout.strip() == \
            on(CTL, "grep -c ^SlurmctldHost /etc/slurm/slurm.conf").stdout.strip()
    assert on(LOGIN, "systemctl is-active munge").stdout.strip() == "active"


def test_ldap_user_compiles_submits_watches_and_reads_from_the_login_node(lab):
    home = "nfs://%s/srv/shared/home/alice" % CTL
    on(LOGIN, "cat > /tmp/mpi-hello.c <<'EOF'\n%sEOF\ncat > /tmp/login-mpi.sh <<'EOF'\n%sEOF\n"
              "chmod 0644 /tmp/mpi-hello.c /tmp/login-mpi.sh" % (MPI_HELLO, JOB))
    # alice, from the directory, compiles with MPICH's wrapper on the login node into her home
    on(LOGIN, "cd /tmp && runuser -u alice -- mpicc -o /tmp/mpi-hello-alice /tmp/mpi-hello.c")
    on(LOGIN, "cd /tmp && runuser -u alice -- nfs-cp /tmp/mpi-hello-alice %s/mpi-hello" % home)
    job_id = on(LOGIN, "cd /tmp && runuser -u alice -- sbatch --parsable /tmp/login-mpi.sh").stdout.strip()
    assert re.fullmatch(r"\d+", job_id)
    # squeue from the login node sees her job (or it has already finished and left the queue)
    seen = on(LOGIN, "runuser -u alice -- squeue -h -u alice -o '%i %u %P'").stdout
    finished = "JobState=COMPLETED" in job_state(job_id)
    assert "%s alice compute" % job_id in seen or finished, seen
    wait_gone_from_queue(job_id)
    record = job_state(job_id)
    assert "UserId=alice(5001)" in record and "JobState=COMPLETED" in record and "ExitCode=0:0" in record
    out = on(LOGIN, "cd /tmp && runuser -u alice -- nfs-cat %s/login-mpi-%s.out" % (home, job_id)).stdout
    lines = out.strip().splitlines()
    assert sorted(line.split(" on ")[0] for line in lines[:-1]) == ["rank 0 of 2", "rank 1 of 2"], lines
    assert all(line.endswith(" on %s" % CN) for line in lines[:-1]) and lines[-1] == "job %s by alice" % job_id


def test_a_bad_gres_declaration_fails_before_any_change(lab):
    before = {m: on(m, "sha256sum /etc/slurm/gres.conf /etc/default/slurmd 2>/dev/null", check=False).stdout
              for m in (CTL, GPU)}
    try:
        # not a GRES Slurm would take: the contract names the host and the annotation
        annotate_machine(GPU, "gpu:two")
        res = LAB.playbook("site.yml")
        assert res.returncode != 0
        assert "host %s: annotation %s: 'gpu:two' is not a GRES" % (GPU, GRES_ANNOTATION) in res.stdout
        # more GPUs than the machine has device files for: the node's preflight names the missing one
        annotate_machine(GPU, "gpu:lab:3")
        res = LAB.playbook("site.yml")
        assert res.returncode != 0
        assert "%s declares GRES gpu:lab:3 but has no /dev/nvidia2" % GPU in res.stdout
        assert not re.search(r"changed=[1-9]", res.stdout), res.stdout[-3000:]
    finally:
        annotate_machine(GPU, "gpu:lab:2")
    assert {m: on(m, "sha256sum /etc/slurm/gres.conf /etc/default/slurmd 2>/dev/null", check=False).stdout
            for m in (CTL, GPU)} == before


def test_a_node_type_without_a_partition_fails_before_any_change(lab):
    before = on(CTL, "sha256sum /etc/slurm/slurm.conf").stdout
    res = LAB.playbook("site.yml", '{"converged_node_types": {"controller": {"role": "controller"}, '
                                   '"compute": {"role": "compute", "nodeset": "computeset", "partitions": ["compute"]}, '
                                   '"gpu": {"role": "compute", "nodeset": "gpuset"}, '
                                   '"highmem": {"role": "compute", "nodeset": "highmemset", "partitions": ["highmem"]}, '
                                   '"login": {"role": "login"}, "accounting": {"role": "accounting"}}, '
                                   '"converged_partitions": [{"name": "compute", "default": true}, {"name": "highmem"}]}')
    assert res.returncode != 0
    assert "node type gpu (role compute) is in no partition" in res.stdout
    assert not re.search(r"changed=[1-9]", res.stdout)
    assert on(CTL, "sha256sum /etc/slurm/slurm.conf").stdout == before


def os_memory(host):
    """RealMemory as the host's OS reports it (slurmd -C), in MiB."""
    return int(re.search(r"\bRealMemory=(\d+)", on(host, "slurmd -C").stdout).group(1))


def set_metal3_hardware(host, ram_mib, cpus):
    kube().patch_namespaced_custom_object_status("metal3.io", "v1alpha1", "metal3", "baremetalhosts", host,
                                                 {"status": {"hardware": {"ramMebibytes": ram_mib,
                                                                          "cpu": {"count": cpus}}}})


def test_hardware_is_never_declared_above_what_the_host_shows(lab):
    seen = os_memory(CN)
    cpus = int(re.search(r"\bCPUs=(\d+)", on(CN, "slurmd -C").stdout).group(1))
    metal3 = kube().get_namespaced_custom_object("metal3.io", "v1alpha1", "metal3", "baremetalhosts", CN)
    files = "sha256sum /etc/default/slurmd"
    before = {m: on(m, files).stdout for m in (CN, GPU, HM)}
    # Metal3 reports the memory installed, and the OS sees less of it: the smaller is declared.
    # Metal3's CPU count above what the host shows (CPUs offline, SMT off): slurmd's own topology.
    set_metal3_hardware(CN, seen + 1024, cpus + 4)
    try:
        res = LAB.sh("ansible-playbook", "-i", os.path.join(LAB.state, "capi.capi_machines.yml"),
                     "playbooks/site.yml", "--check", "--diff", "--limit", CN, check=False)
        assert res.returncode == 0, res.stdout[-3000:]
        options = re.search(r"^\+SLURMD_OPTIONS=.*$", res.stdout, re.M)
        assert options and " RealMemory=%d " % seen in options.group(0) and "CPUs=" not in options.group(0), \
            res.stdout[-3000:]
    finally:
        hardware = metal3["status"]["hardware"]
        set_metal3_hardware(CN, hardware["ramMebibytes"], hardware["cpu"]["count"])
    # figures above them, given by hand, fail naming both before slurmd's options are written (the run limited
    # to the host: the others' roles would only say again what the full converges below say)
    for extra, message in (("slurm_compute_real_memory=%d" % (seen + 1),
                            "%s: slurm_compute_real_memory %d MiB is more than the %d MiB the OS reports"
                            % (CN, seen + 1, seen)),
                           ("slurm_compute_cpus=%d" % (cpus + 1),
                            "%s: slurm_compute_cpus %d is more than the %d CPUs the host shows" % (CN, cpus + 1, cpus))):
        res = LAB.playbook("site.yml", extra, limit=CN)
        assert res.returncode != 0
        assert message in res.stdout, res.stdout[-3000:]
        assert not re.search(r"changed=[1-9]", res.stdout), res.stdout[-3000:]
    assert {m: on(m, files).stdout for m in (CN, GPU, HM)} == before


def test_a_node_refused_for_its_memory_registers_again_when_converged(lab):
    # a node whose slurmd declared more memory than it has, as an older declaration did: refused
    on(CN, "sed -i 's/RealMemory=[0-9]*/RealMemory=%d/' /etc/default/slurmd" % (os_memory(CN) + 1))
    on(CTL, "scontrol delete nodename=%s" % CN)
    on(CN, "systemctl restart slurmd")
    deadline = time.time() + 60
    while "INVALID_REG" not in on(CTL, "scontrol show node %s" % CN, check=False).stdout and time.time() < deadline:
        time.sleep(1)
    node = on(CTL, "scontrol show node %s" % CN).stdout
    assert "INVALID_REG" in node and "Low RealMemory" in node, node
    # the converge writes the declaration again; the record keeps the old one, so the refused node
    # (no job can run on it) is deleted and registers again
    res = LAB.playbook("site.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    assert re.search(r"Delete the node's record\] \**\n(?:(?!TASK).*\n)*?changed: \[%s" % CN, res.stdout), res.stdout[-3000:]
    node = on(CTL, "scontrol show node %s" % CN).stdout
    assert "State=IDLE+DYNAMIC_NORM " in node and "RealMemory=2000 " in node, node


def test_a_changed_declaration_reaches_slurm_at_once_on_an_idle_node_and_waits_on_a_busy_one(lab):
    def record():
        return on(CTL, "scontrol show node --oneliner %s" % HM).stdout

    # idle and not drained: the node registers again with the new declaration
    res = LAB.playbook("site.yml", "slurm_compute_mem_spec=512", limit=HM)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "MemSpecLimit=512 " in record() and "State=IDLE+DYNAMIC_NORM " in record(), record()
    # busy: the record keeps its declaration, nothing is stopped, the run says what waits
    job = on(CTL, "sbatch --parsable -p highmem -w %s --wrap 'sleep 600'" % HM).stdout.strip()
    try:
        deadline = time.time() + 60
        while "JobState=RUNNING" not in job_state(job) and time.time() < deadline:
            time.sleep(1)
        res = LAB.playbook("site.yml", limit=HM)
        assert res.returncode == 0, res.stdout[-3000:]
        assert "%s keeps the declaration Slurm recorded (MemSpecLimit 512 -> 256)" % HM in res.stdout, res.stdout[-3000:]
        assert "JobState=RUNNING" in job_state(job) and "MemSpecLimit=512 " in record(), record()
    finally:
        on(CTL, "scancel %s" % job)
    wait_gone_from_queue(job)
    # the host stayed out of the fast path: the next converge applies it, now that the node is idle
    res = LAB.playbook("site.yml")
    assert res.returncode == 0 and NOTHING_TO_DO not in res.stdout, res.stdout[-3000:]
    assert "MemSpecLimit=256 " in record() and "State=IDLE+DYNAMIC_NORM " in record(), record()


def test_second_converge_changes_nothing(lab):
    # the roles themselves: the fast path off, every task runs again and changes nothing
    res = LAB.playbook("site.yml", "converged_skip_unchanged=false")
    assert res.returncode == 0, res.stdout[-3000:]
    assert "converging in full (converged_skip_unchanged is false)" in res.stdout
    recap = res.stdout[res.stdout.rindex("PLAY RECAP"):]
    assert len(re.findall(r"changed=0 ", recap)) == 5 and not re.search(r"changed=[1-9]", recap), recap


NOTHING_TO_DO = "every host is as the last converge left it, with the same inputs: nothing to do"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"


def role_tasks(stdout):
    """The tasks of the collection's roles a run started (the contract's aside)."""
    return [t for t in re.findall(r"^TASK \[(converged\.hpc\.\w+) : ", stdout, re.M) if t != "converged.hpc.converged"]


def test_an_unchanged_cluster_is_left_after_one_check(lab):
    res = LAB.playbook("site.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    assert NOTHING_TO_DO in res.stdout
    assert role_tasks(res.stdout) == [] and "Gather the minimal facts" not in res.stdout
    recap = res.stdout[res.stdout.rindex("PLAY RECAP"):]
    assert len(re.findall(r"changed=0 ", recap)) == 5 and not re.search(r"changed=[1-9]", recap), recap


def test_drift_on_any_host_converges_everything_again(lab):
    on(CN, "echo '# drift' >> /etc/default/slurmd")          # a file a role writes
    on(CTL, "systemctl stop sssd")                              # a service a role runs
    # state inside slurmctld: Slurm 22.05 forgets a dynamic node's MemSpecLimit when slurmctld restarts
    # (later releases keep it)
    forgets = LAB.slurm_release(CTL) == "22.05"
    on(CTL, "systemctl restart slurmctld && until scontrol ping | grep -q 'is UP'; do sleep 0.5; done")
    assert ("MemSpecLimit=" in on(CTL, "scontrol show node --oneliner %s" % CN).stdout) != forgets
    on(CTL, "scontrol delete nodename=%s" % HM)               # a record deleted by hand; its slurmd runs on
    # our hook, taken off the controller's Machine (site.yml put it there; on a compute Machine the template's
    # hook would be put back by Cluster API at once)
    kube().patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machines", machine_name(CTL),
                                          {"metadata": {"annotations": {HOOK: None}}})
    # check mode says what a run would do for the missing record, and does not wait for it
    pid = on(HM, "systemctl show -p MainPID --value slurmd").stdout.strip()
    res = LAB.sh("ansible-playbook", "-i", os.path.join(LAB.state, "capi.capi_machines.yml"), "playbooks/site.yml",
                 "--check", "-e", "converged_skip_unchanged=false", "--limit", HM, check=False)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "check mode: Slurm has no record of %s; a run would restart slurmd on %s and wait for it to register" \
        % (HM, HM) in res.stdout, res.stdout[-3000:]
    assert on(HM, "systemctl show -p MainPID --value slurmd").stdout.strip() == pid
    assert "Node %s not found" % HM in on(CTL, "scontrol show node %s 2>&1" % HM, check=False).stdout
    res = LAB.playbook("site.yml")
    assert res.returncode == 0, res.stdout[-3000:]
    assert NOTHING_TO_DO not in res.stdout and "converging in full" in res.stdout
    why = re.search(r"converging in full.*", res.stdout).group(0)
    assert "%s: /etc/default/slurmd changed" % CN in res.stdout
    # the controller's reasons: its Machine's hook first, then its own state, then what slurmctld, asked
    # there, says: what it forgot on its restart, and the record deleted by hand
    ctl_reasons = re.search(r"; %s: ([^;]*)" % CTL, why).group(1)
    assert ctl_reasons.startswith("the Machine lacks the deletion hook, "), why
    assert "unit sssd is loaded/inactive/enabled (was loaded/active/enabled)" in ctl_reasons, why
    assert ("node %s's record has MemSpecLimit 0, it declares 256" % CN in ctl_reasons) == forgets, why
    assert "Slurm has no record of node %s" % HM in ctl_reasons, why
    assert "converged.hpc.slurm_controller" in role_tasks(res.stdout)  # every host, not only the three
    # repaired: the file rendered again (slurmd restarted), sssd running, the hook back
    assert "# drift" not in on(CN, "cat /etc/default/slurmd").stdout
    assert on(CTL, "systemctl is-active sssd").stdout.strip() == "active"
    machine = machine_of(kube(), CTL)
    assert machine["metadata"]["annotations"].get(HOOK) == "converged-hpc"
    assert on(CTL, "sinfo --noheader --Node --format '%%N %%t' --nodes %s" % CN).stdout.split() == [CN, "idle"]
    for node in (CN, GPU, HM):  # each idle node registered again, and its record has it back
        assert "MemSpecLimit=256 " in on(CTL, "scontrol show node --oneliner %s" % node).stdout, node
    res = LAB.playbook("site.yml")
    assert res.returncode == 0 and NOTHING_TO_DO in res.stdout, \
        "".join(re.findall(r"converging in full.*", res.stdout)) + res.stdout[-3000:]


# What the GPU MachineDeployment's template names as its bootstrap data (lab/capi_objects.py):
# the new GPU host gets it at first boot, through cloud-init, as Metal3 hands it over.
BOOTSTRAP = ("#cloud-config\nwrite_files:\n  - path: /etc/converged-lab-bootstrap\n"
             "    content: |\n      written at first boot from the Machine's bootstrap data\n")


def test_a_gpu_node_added_by_its_machine_deployment_joins_with_its_gpus(lab):
    from kubernetes import client
    core = client.CoreV1Api(api_client())
    md = kube().get_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", "hlab-gpu")
    core.create_namespaced_secret("metal3", {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": md["spec"]["template"]["spec"]["bootstrap"]["dataSecretName"]},
        "data": {"value": base64.b64encode(BOOTSTRAP.encode()).decode(),
                 "format": base64.b64encode(b"cloud-config").decode()}})
    res = sh("python3", "lab/scale.py", "2", "--node-type", "gpu", "--state", LAB.state, "--cluster", "hlab",
             check=False, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    new = "hlab-gpu-02"
    # its line reached gres.conf before it registered; the first GPU node kept its record and GPUs
    assert "NodeName=%s Name=gpu Type=lab File=/dev/nvidia[0-1]" % new in on(CTL, "cat /etc/slurm/gres.conf").stdout
    rows = on(CTL, "sinfo --noheader -p gpu --Node --format '%N %t %G'").stdout.split("\n")
    assert sorted(r for r in rows if r.strip()) == ["%s idle gpu:lab:2" % GPU, "%s idle gpu:lab:2" % new]
    assert on(CTL, "srun -p gpu -w %s --gres=gpu:2 printenv CUDA_VISIBLE_DEVICES" % new).stdout.strip() == "0,1"
    assert on(CTL, "srun -p gpu -w %s --gres=gpu:2 printenv CUDA_VISIBLE_DEVICES" % GPU).stdout.strip() == "0,1"
    # the node took jobs only once what they run with was there: MPICH read back before slurmd started
    with open(os.path.join(LAB.state, "logs", "scale_up.log")) as handle:
        log = handle.read()
    assert log.index("TASK [converged.hpc.mpich : Read the MPICH version]") \
        < log.index("TASK [converged.hpc.slurm_compute : Start slurmd now and at boot]"), log[-3000:]


def test_a_new_host_applies_its_machines_bootstrap_data_at_first_boot(lab):
    assert on("hlab-gpu-02", "cat /etc/converged-lab-bootstrap").stdout.strip() == \
        "written at first boot from the Machine's bootstrap data"
    assert on("hlab-gpu-02", "cloud-init status").stdout.strip() == "status: done"
    # a host booted without bootstrap data runs no cloud-init at all
    assert on(GPU, "cloud-init status").stdout.strip() == "status: disabled"
    assert on(GPU, "test -e /etc/converged-lab-bootstrap", check=False).returncode != 0


def test_a_highmem_node_scales_up_and_down_through_its_machine_deployment(lab):
    # (MachinePools: CAPM3 has no MachinePool machines, so a lab of Metal3 hosts has none; the inventory's
    # MachinePool support is tested on the recorded objects)
    res = sh("python3", "lab/scale.py", "2", "--node-type", "highmem", "--state", LAB.state,
             "--cluster", "hlab", check=False, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    new = "hlab-hm-02"
    machines = kube().list_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machines",
                                                    label_selector="cluster.x-k8s.io/deployment-name=hlab-highmem")["items"]
    assert len(machines) == 2
    for machine in machines:
        assert [o["kind"] for o in machine["metadata"]["ownerReferences"]] == ["MachineSet"]
    # the inventory groups the deployment's hosts (by their hosts' names); Slurm has the new node in the
    # highmem partition
    graph = sh("ansible-inventory", "-i", os.path.join(LAB.state, "capi.capi_machines.yml"), "--graph",
               "capi_md_hlab_highmem").stdout
    assert "|--%s\n" % HM in graph and "|--%s\n" % new in graph, graph
    rows = on(CTL, "sinfo --noheader -p highmem --Node --format '%N %t'").stdout.split("\n")
    assert sorted(r for r in rows if r.strip()) == ["%s idle" % HM, "%s idle" % new]
    job = on(CTL, "sbatch --parsable --wait -p highmem -w %s --mem=3000 --output=/dev/null --wrap hostname"
             % new).stdout.strip()
    assert "JobState=COMPLETED" in job_state(job)
    # down: the new node's Machine (marked: Cluster API deletes at random otherwise) waits for our hook until
    # scale_down.yml has drained it and deleted it from Slurm
    kube().patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machines", machine_name(new),
                                          {"metadata": {"annotations": {"cluster.x-k8s.io/delete-machine": "yes"}}})
    res = sh("python3", "lab/scale.py", "1", "--node-type", "highmem", "--state", LAB.state,
             "--cluster", "hlab", check=False, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "held by the pre-terminate hook" in res.stdout and "Machines gone" in res.stdout
    rows = on(CTL, "sinfo --noheader -p highmem --Node --format '%N %t'").stdout.split("\n")
    assert [r for r in rows if r.strip()] == ["%s idle" % HM]
    wait_for_gone = time.time() + 60
    while sh("podman", "container", "exists", new, check=False).returncode == 0 and time.time() < wait_for_gone:
        time.sleep(1)  # the host agent removes the machine once its host is deprovisioning
    assert sh("podman", "container", "exists", new, check=False).returncode != 0


def test_a_compute_node_joins_at_first_boot_with_its_directory_users(lab):
    from kubernetes import client
    core = client.CoreV1Api(api_client())
    password = open(os.path.join(LAB.state, "directory", "bind.pw")).read().strip()
    # GPU nodes need their gres.conf line on the controllers first: refused, nothing written
    res = LAB.playbook("join_at_boot.yml", '{"converged_join_at_boot": ["hlab-compute", "hlab-gpu"]}')
    assert res.returncode != 0, res.stdout[-3000:]
    assert "MachineDeployment metal3/hlab-gpu: its nodes declare GRES (gpu:lab:2)" in res.stdout, res.stdout[-3000:]
    assert not [s for s in core.list_namespaced_secret("metal3").items if s.metadata.name.endswith("-join")]
    res = LAB.playbook("join_at_boot.yml", '{"converged_join_at_boot": ["hlab-compute"]}')
    assert res.returncode == 0, res.stdout[-3000:]
    assert password not in res.stdout + res.stderr
    value = base64.b64decode(core.read_namespaced_secret("hlab-compute-join", "metal3").data["value"]).decode()
    assert "ldap_default_authtok = %s\n" % password in value and "- path: /etc/sssd/sssd.conf" in value
    md = "hlab-compute"
    # Cluster API rolls a MachineDeployment out anew when its template changes (the bootstrap Secret's name):
    # each Machine replaced, the old ones held by our hook until drained. Join at boot is for new Machines:
    # the compute node leaves first (scale_down.yml), then the template names the Secret
    res = sh("python3", "lab/scale.py", "0", "--state", LAB.state, "--cluster", "hlab", check=False, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    kube().patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", md, {
        "spec": {"template": {"spec": {"bootstrap": {"dataSecretName": "hlab-compute-join"}}}}})
    try:
        res = sh("python3", "lab/scale.py", "1", "--wait-idle", "--state", LAB.state, "--cluster", "hlab",
                 check=False, timeout=600)
        assert res.returncode == 0 and "their first boot joined them: IDLE" in res.stdout, res.stdout + res.stderr
        # whichever of the two compute hosts CAPM3 claimed
        (machine,) = kube().list_namespaced_custom_object(
            "cluster.x-k8s.io", "v1beta2", "metal3", "machines",
            label_selector="cluster.x-k8s.io/deployment-name=" + md)["items"]
        new = next(a["address"] for a in machine["status"]["addresses"] if a["type"] == "Hostname")
        # identity before jobs: SSSD resolved the directory's user before slurmd started
        log = on(new, "journalctl -t converged-hpc-join --no-pager").stdout
        assert "slurmd started as Slurm node %s" % new in log, log
        started = {unit: int(on(new, "systemctl show -P ActiveEnterTimestampMonotonic %s" % unit).stdout)
                   for unit in ("sssd", "slurmd")}
        assert 0 < started["sssd"] < started["slurmd"], started
        assert on(new, "stat -c '%U %a' /etc/sssd/sssd.conf").stdout.split() == ["root", LAB.sssd_conf_mode(new)]
        assert on(new, "getent passwd alice").stdout.startswith("alice:")
        # a directory user's job, submitted on the login node, runs there as that user
        assert on(LOGIN, "cd /tmp && runuser -u alice -- srun -p compute -w %s id -un" % new).stdout.strip() == "alice"
        # the converge that follows finds SSSD as the role writes it
        res = LAB.playbook("identity.yml", limit=new)
        assert res.returncode == 0 and re.search(r"ok=\d+\s+changed=0", res.stdout), res.stdout[-3000:]
        # it leaves as any node
        res = sh("python3", "lab/scale.py", "0", "--state", LAB.state, "--cluster", "hlab", check=False, timeout=600)
        assert res.returncode == 0 and "Machines gone" in res.stdout, res.stdout + res.stderr
        nodes = on(CTL, "sinfo --noheader --Node --format %N").stdout.split()
        assert new not in nodes and GPU in nodes, nodes
    finally:
        kube().patch_namespaced_custom_object("cluster.x-k8s.io", "v1beta2", "metal3", "machinedeployments", md, {
            "spec": {"template": {"spec": {"bootstrap": {"dataSecretName": md}}}}})
