"""Queue-driven autoscaling end to end in a lab of its own: real Slurm, the real Cluster API,
CAPM3 and Bare Metal Operator controllers, and nobody running a playbook by hand in the first test -
ansible-rulebook (converged.hpc.autoscale) runs autoscale.yml on a tick and reconcile.yml
on Machine events.

The lab starts with no compute machine (LAB_COMPUTE=0): its compute MachineDeployment is
at 0 replicas, autoscaled between the Cluster API autoscaler annotations' min 0 and max 3.
Order matters (one lab, module scope): 0 -> jobs -> 3 -> every job done -> 0; jobs more
nodes would not start scale nothing; then by hand: max reached, min kept, bad input; then
new Machines that join Slurm at their first boot (playbooks/join_at_boot.yml).
"""

import base64
import json
import os
import re
import time

import pytest
from kubernetes import client, config

from labkit import Lab, has_podman, wait_for

# LAB_RAM_MIB: the BareMetalHosts report more memory than the machines show, as real ones do (Metal3's
# figure is the memory installed), so a node that joined at boot declares what a converge would
LAB = Lab("alab", "10.89.87", 16487, ".lab/e2e-autoscale", LAB_COMPUTE="0", LAB_DIRECTORY="0",
          LAB_EVENTS_RULEBOOK="autoscale", LAB_AUTOSCALE_INTERVAL="10", LAB_RAM_MIB="1048576",
          LAB_LEAST_PRIVILEGE="1")
STATE = LAB.state
sh, on = LAB.sh, LAB.on
CTL = "alab-ctl-01"
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
MD = "alab-compute"
IDLE_TIME = 20
MIN_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size"
MAX_ANNOTATION = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    api = config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig"))
    co = client.CustomObjectsApi(api)
    co.patch_namespaced_custom_object(G, V, NS, "machinedeployments", MD, {"metadata": {"annotations": {
        MIN_ANNOTATION: "0", MAX_ANNOTATION: "3"}}})
    with open(os.path.join(STATE, "group_vars", "all", "autoscale.yml"), "w") as fh:
        fh.write("converged_autoscale_idle_time: %d\nconverged_autoscale_cooldown: 15\n" % IDLE_TIME)
    yield co
    sh("lab/lab.sh", "events-stop", check=False)
    LAB.down()


def replicas(co):
    return co.get_namespaced_custom_object(G, V, NS, "machinedeployments", MD)["spec"]["replicas"]


def machines(co):
    return co.list_namespaced_custom_object(G, V, NS, "machines",
                                            label_selector="cluster.x-k8s.io/deployment-name=" + MD)["items"]


def slurm_nodes():
    out = LAB.ask(CTL, "sinfo --noheader --Node --format '%N %t'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def submit(nodes, *options):
    res = on(CTL, "sbatch --parsable -N %d %s --output=/tmp/as-%%j.out --wrap 'sleep 8; hostname'"
             % (nodes, " ".join(options)))
    return res.stdout.strip()


def job_state(job):
    out = LAB.ask(CTL, "scontrol show job --oneliner %s" % job, timeout=60,
                  accept=lambda res: "Invalid job id" in res.stdout + res.stderr)
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"ExitCode=(\S+)", out)
    return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "")


def events_log():
    path = os.path.join(STATE, "logs", "events.log")
    return open(path).read() if os.path.exists(path) else ""


def wait(what, predicate, timeout, poll=2):
    return wait_for(what, predicate, timeout, poll,
                    explain=lambda: "Slurm: %s\nevents log:\n%s" % (slurm_nodes(), events_log()[-4000:]))


def validate_report():
    """The lines of validate.yml's report from the lab's converge (lab/lab.sh converge)."""
    log = open(os.path.join(STATE, "logs", "validate.log")).read()
    block = log[log.index("TASK [Report]"):]
    block = block[:block.index("PLAY RECAP")]
    return [line.strip().rstrip(",").strip('"') for line in block.splitlines() if line.strip().startswith('"')
            and not line.strip().startswith('"msg"')]


@pytest.mark.gate
def test_validate_with_no_compute_node_says_what_it_skipped_and_claims_nothing(lab):
    # the lab's converge validated a cluster with no compute node: no job could run, and the report says so
    report = validate_report()
    assert "nodes IDLE: none (no compute node in the inventory)" in report, report
    assert "partitions: no node in any partition: srun skipped" in report, report
    assert "sbatch job: skipped (no compute node)" in report, report
    assert "MPI: skipped (no compute node)" in report, report
    assert "munge: skipped (no compute node to decode a credential on)" in report, report
    assert "accounting: on; no job to read back (no compute node)" in report, report
    assert any(line.startswith("skipped, no compute node: srun, the batch job, MPI") for line in report), report
    # and nothing it did not see: no job, no rank, no accounting record
    text = "\n".join(report)
    assert "exit code 0" not in text and "rank(s) reported" not in text and "sacct job" not in text, report
    assert on(CTL, "sacct --noheader --allocations --allusers --starttime 2000-01-01 --format JobID").stdout.strip() \
        == "", "validate.yml ran no job, yet accounting holds one"
    assert any(line.startswith("REST: slurmrestd v0.0.") for line in report), report


@pytest.mark.gate
def test_an_empty_pool_grows_runs_every_job_and_shrinks_back_to_zero(lab):
    assert replicas(lab) == 0 and machines(lab) == [] and slurm_nodes() == {}
    # submitted at once, before the event path starts: its first tick sees the three
    jobs = on(CTL, "for n in 1 2 2; do sbatch --parsable -N $n --output=/tmp/as-%j.out --wrap 'sleep 8; hostname'; "
                   "done").stdout.split()
    assert len(jobs) == 3, jobs
    started = time.time()
    sh("lab/lab.sh", "events")
    peak, busy_removed = [0], []

    def watch():
        # every 2 s: the replicas never exceed max; no Machine is deleted while its node runs a job
        peak[0] = max(peak[0], replicas(lab))
        nodes = slurm_nodes()
        for m in machines(lab):
            if m["metadata"].get("deletionTimestamp"):
                name = m["metadata"]["name"]
                if nodes.get(name) in ("alloc", "mix", "comp"):
                    busy_removed.append((name, nodes[name]))
        return all(job_state(j)[0] == "COMPLETED" for j in jobs)

    wait("every job completed", watch, 600)
    done = time.time() - started
    assert [job_state(j) for j in jobs] == [("COMPLETED", "0:0")] * 3
    assert peak[0] == 3  # 5 nodes' worth of jobs, max 3
    wait("scaled back to 0", lambda: watch() and replicas(lab) == 0 and not machines(lab) and not slurm_nodes(),
         300)
    assert busy_removed == [] and peak[0] == 3
    log = events_log()
    assert re.search(r"autoscale metal3/alab-compute \(partition compute\): pending 3 job\(s\) needing 5 node\(s\)"
                     r".*replicas 0 -> 3 \(5 node\(s\) short; max 3 reached: 3 job\(s\) wait\)", log), log[-4000:]
    assert re.search(r"replicas \d -> \d \(idle >= %d s: alab-cn-" % IDLE_TIME, log), log[-4000:]
    with open(os.path.join(STATE, "logs", "autoscale-figures.tsv"), "a") as fh:
        fh.write("jobs 1+2+2 nodes, 0 -> 3 -> 0\tall done %.1f s\tback to 0 %.1f s\n" % (done, time.time() - started))


@pytest.mark.gate
def test_jobs_more_nodes_would_not_start_scale_nothing(lab):
    held = submit(1, "--hold")
    dependent = submit(1, "--dependency=afterok:%s" % held)
    mark = len(events_log())
    # two autoscale runs at least (a tick every 10 s; a run waits for the one before it, and takes a
    # minute on a loaded machine)
    wait("two autoscale runs", lambda: events_log()[mark:].count("pending for Dependency") >= 2, 300)
    log = events_log()[mark:]
    assert "job %s: pending for JobHeldUser - more nodes would not start it" % held in log, log[-3000:]
    assert "job %s: pending for Dependency - more nodes would not start it" % dependent in log, log[-3000:]
    assert replicas(lab) == 0 and machines(lab) == []
    on(CTL, "scancel %s %s" % (held, dependent))


def test_max_reached_jobs_wait_and_min_keeps_nodes(lab):
    sh("lab/lab.sh", "events-stop")
    pools = pools_var({"name": MD, "min": 1, "max": 2})
    quick = "converged_autoscale_idle_time=%d" % IDLE_TIME
    jobs = [submit(1) for dummy in range(4)]
    res = LAB.playbook("autoscale.yml", pools, quick)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "replicas 0 -> 2 (4 node(s) short; max 2 reached: 4 job(s) wait)" in res.stdout, res.stdout
    assert replicas(lab) == 2
    # the controllers provision the hosts and the host agent boots them; then reconcile joins them (the event
    # path is stopped)
    wait("2 Machines Provisioned", lambda: [m.get("status", {}).get("phase") for m in machines(lab)]
         == ["Provisioned"] * 2, 180)
    res = LAB.playbook("reconcile.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert len(slurm_nodes()) == 2, slurm_nodes()
    # at max, with jobs still waiting: nothing more
    res = LAB.playbook("autoscale.yml", pools, quick)
    assert res.returncode == 0 and replicas(lab) == 2, res.stdout
    wait("the 4 jobs completed", lambda: all(job_state(j)[0] == "COMPLETED" for j in jobs), 300)
    # idle long enough: down to min 1, the other node kept
    time.sleep(IDLE_TIME + 1)
    res = LAB.playbook("autoscale.yml", pools, quick, "converged_autoscale_cooldown=0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "replicas 2 -> 1 (idle >= %d s: " % IDLE_TIME in res.stdout, res.stdout
    assert replicas(lab) == 1

    def marked():
        return [m for m in machines(lab) if "cluster.x-k8s.io/delete-machine" in m["metadata"].get("annotations", {})]
    assert len(marked()) == 1, marked()
    # Cluster API's MachineSet deletes the marked Machine (the pre-terminate hook holds it)
    wait("the marked Machine being deleted", lambda: all(m["metadata"].get("deletionTimestamp") for m in marked()),
         60)
    res = LAB.playbook("reconcile.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    wait("one node left", lambda: len(machines(lab)) == 1 and len(slurm_nodes()) == 1, 120)
    res = LAB.playbook("autoscale.yml", pools, quick, "converged_autoscale_cooldown=0")
    assert res.returncode == 0 and "min 1 kept" in res.stdout and replicas(lab) == 1, res.stdout


def pools_var(*pools):
    return json.dumps({"converged_autoscale_pools": list(pools)})


@pytest.mark.parametrize("extra, message", [
    (pools_var({"name": MD, "min": 3, "max": 1}), "MachineDeployment metal3/alab-compute: min 3 > max 1"),
    (pools_var({"name": "alab-controller", "max": 2}),
     "its Machines are node type controller, which feeds no Slurm nodeset"),
    (pools_var({"name": "alab-gpu", "max": 2}), "names MachineDeployment alab-gpu, which the cluster does not have"),
])
def test_bad_input_fails_before_any_change(lab, extra, message):
    before = replicas(lab)
    res = LAB.playbook("autoscale.yml", extra)
    assert res.returncode != 0 and message in res.stdout, res.stdout
    assert replicas(lab) == before


def test_a_partition_slurm_does_not_have_fails_before_any_change(lab):
    before = replicas(lab)
    res = LAB.playbook("autoscale.yml", pools_var({"name": MD, "max": 2}), json.dumps({
        "converged_partitions": [{"name": "compute", "default": True}, {"name": "batch"}],
        "converged_node_types": {"controller": {"role": "controller"}, "compute": {
            "role": "compute", "nodeset": "computeset", "partitions": ["compute", "batch"]}}}))
    assert res.returncode != 0, res.stdout
    assert "partition(s) batch of node type compute do not exist in Slurm (it has: compute, gpu, highmem)" in res.stdout, res.stdout
    assert replicas(lab) == before


def test_dry_run_decides_and_changes_nothing(lab):
    before = replicas(lab)
    jobs = [submit(2), submit(2)]
    res = LAB.playbook("autoscale.yml", pools_var({"name": MD, "max": 3}), "converged_autoscale_dry_run=true")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "replicas %d -> 3" % before in res.stdout, res.stdout
    assert replicas(lab) == before
    on(CTL, "scancel %s" % " ".join(jobs))


JOIN = MD + "-join"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"


def join_at_boot(*args):
    """join_at_boot.yml; its output goes to the lab's logs too (test_no_secret_in_any_log reads them)."""
    res = sh("ansible-playbook", "-i", os.path.join(STATE, "capi.capi_machines.yml"), "playbooks/join_at_boot.yml",
             *args, check=False)
    with open(os.path.join(STATE, "logs", "join_at_boot.log"), "a") as fh:
        fh.write(res.stdout + res.stderr)
    return res


def core():
    return client.CoreV1Api(config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig")))


def secret_names():
    return [s.metadata.name for s in core().list_namespaced_secret(NS).items]


def set_bootstrap(co, name):
    co.patch_namespaced_custom_object(G, V, NS, "machinedeployments", MD, {"spec": {"template": {"spec": {
        "bootstrap": {"dataSecretName": name}}}}})


def changed_tasks(stdout, host):
    """The tasks of an ansible-playbook run that reported changed on host."""
    return [block.split("]", 1)[0] for block in stdout.split("TASK [")[1:]
            if re.search(r"^changed: \[%s[\] ]" % re.escape(host), block, re.M)]


@pytest.mark.parametrize("extra, message", [
    ({"converged_join_at_boot": ["alab-controller"]},
     "MachineDeployment metal3/alab-controller: its Machines are node type controller, which feeds no Slurm nodeset"),
    ({"converged_join_at_boot": [MD], "converged_hook_name": "other"},
     "MachineDeployment metal3/alab-compute: its template does not carry our deletion hook"),
    ({"converged_join_at_boot": [MD], "sssd_ldap_uri": ["http://alab-dir"]},
     "sssd_ldap_uri 'http://alab-dir' is not an ldap:// or ldaps:// URI"),
    ({"converged_join_at_boot": ["alab-nope"]},
     "converged_join_at_boot names MachineDeployment alab-nope, which the cluster does not have"),
])
def test_what_cannot_join_at_boot_is_refused_before_anything_is_written(lab, extra, message):
    res = join_at_boot("-e", json.dumps(extra))
    assert res.returncode != 0 and message in res.stdout, res.stdout[-3000:]
    assert JOIN not in secret_names()


def test_a_secret_converged_hpc_did_not_write_is_never_overwritten(lab):
    core().create_namespaced_secret(NS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": JOIN},
                                         "data": {"value": base64.b64encode(b"theirs").decode()}})
    try:
        res = join_at_boot("-e", json.dumps({"converged_join_at_boot": [MD]}))
        assert res.returncode != 0, res.stdout[-3000:]
        assert "Secret %s exists and converged.hpc did not write it" % JOIN in res.stdout, res.stdout[-3000:]
        assert base64.b64decode(core().read_namespaced_secret(JOIN, NS).data["value"]) == b"theirs"
    finally:
        core().delete_namespaced_secret(JOIN, NS)


def test_new_machines_join_slurm_at_first_boot_with_no_playbook_run(lab):
    sh("lab/lab.sh", "events-stop")  # nobody runs a playbook: the first boot does it all
    requested = json.dumps({"converged_join_at_boot": [MD]})
    res = join_at_boot("-e", requested)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "its new Machines join at boot once its template names the Secret " \
           "(spec.template.spec.bootstrap.dataSecretName: %s)" % JOIN in res.stdout, res.stdout[-3000:]
    assert changed_tasks(res.stdout, "localhost") == ["Write the Secret %s" % JOIN], res.stdout[-3000:]
    # the key is in the Secret, nowhere in the output; written again only when it differs; check mode too
    key = open(os.path.join(STATE, "capi", "munge.key"), "rb").read()
    value = base64.b64decode(core().read_namespaced_secret(JOIN, NS).data["value"]).decode()
    assert value.startswith("#cloud-config\n") and base64.b64encode(key).decode() in value
    assert "--conf 'Feature=compute RealMemory=@MEMORY@ MemSpecLimit=256'" in value, value
    for args in ([], ["--check"]):
        again = join_at_boot("-e", requested, *args)
        assert again.returncode == 0 and changed_tasks(again.stdout, "localhost") == [], again.stdout[-3000:]
    # Cluster API rolls a MachineDeployment out anew when its template changes (the bootstrap Secret's name):
    # each Machine it has is replaced (a new MachineSet, maxSurge 1), the old ones deleted and held by our
    # hook until drained. Join at boot is for the new Machines: start from none (the playbook says the
    # template change is the site's to make for that reason)
    if replicas(lab):
        res = sh("python3", "lab/scale.py", "0", "--state", STATE, "--cluster", "alab", check=False, timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
    set_bootstrap(lab, JOIN)
    try:
        before = {m["metadata"]["name"] for m in machines(lab)}
        res = sh("python3", "lab/scale.py", str(replicas(lab) + 2), "--wait-idle", "--state", STATE,
                 "--cluster", "alab", check=False, timeout=600)
        assert res.returncode == 0 and "their first boot joined them: IDLE" in res.stdout, res.stdout + res.stderr
        new = {m["metadata"]["name"]: m for m in machines(lab) if m["metadata"]["name"] not in before}
        assert len(new) == 2
        with open(os.path.join(STATE, "logs", "autoscale-figures.tsv"), "a") as fh:
            fh.write("join at boot +2\t%s\n" % re.search(r"IDLE .*after the scale", res.stdout).group(0))
        nodes = set()
        for name, machine in sorted(new.items()):
            node = next(a["address"] for a in machine["status"]["addresses"] if a["type"] == "Hostname")
            nodes.add(node)
            # the hook came with the template: on the Machine before its node could take a job
            assert machine["metadata"]["annotations"].get(HOOK) == "converged-hpc", machine["metadata"]
            record = on(CTL, "scontrol show node --oneliner %s" % node).stdout
            assert "State=IDLE+DYNAMIC_NORM " in record and "MemSpecLimit=256 " in record, record
            assert "AvailableFeatures=compute " in record, record
            assert on(node, "cloud-init status").stdout.strip() == "status: done"
            assert "]: slurmd started as Slurm node %s (RealMemory=" % node in \
                on(node, "journalctl -t converged-hpc-join --no-pager").stdout
            # the ready script came with the bootstrap data: slurmctld asked to schedule once it registered
            log = on(node, "journalctl -t converged-hpc-slurmd-ready --no-pager").stdout
            assert re.search(r"%s registered [A-Z]+\+DYNAMIC_NORM: scheduling asked through partition\(s\) compute"
                             % node, log), log
            assert on(node, "stat -c '%a' /usr/local/libexec/converged-hpc/slurmd-ready").stdout.strip() == "755"
            assert on(node, "stat -c '%U %a' /etc/munge/munge.key").stdout.split() == ["munge", "400"]
            # a job runs there: munge with the cluster's key, the node's name, MPICH
            assert on(CTL, "srun -w %s hostname" % node).stdout.strip() == node
            assert on(CTL, "srun -w %s mpichversion" % node).stdout.startswith("MPICH Version")
        # the Machine event's playbook finds nothing to converge; a converge of the new hosts changes
        # nothing but its own record of them
        res = LAB.playbook("scale_up.yml")
        assert res.returncode == 0 and "new to Slurm: none" in res.stdout, \
            "\n".join(line for line in res.stdout.splitlines() if "new to Slurm" in line) + res.stdout[-3000:] + \
            on(CTL, "sinfo --noheader --Node --format '%N %t'").stdout
        hosts = nodes  # the inventory names hosts as Slurm does (host_naming: hostname)
        res = LAB.playbook("site.yml", limit=",".join(sorted(hosts)))
        assert res.returncode == 0, res.stdout[-3000:]
        for name in hosts:
            assert changed_tasks(res.stdout, name) == ["Record the host's state with the digest of this run's inputs"], \
                res.stdout[-4000:]
        # and they leave as any node: drained, deleted from Slurm, the hook released (marked, so that
        # Cluster API picks them and not the node the lab had before)
        for name in new:
            lab.patch_namespaced_custom_object(G, V, NS, "machines", name, {"metadata": {"annotations": {
                "cluster.x-k8s.io/delete-machine": "yes"}}})
        res = sh("python3", "lab/scale.py", str(replicas(lab) - 2), "--state", STATE, "--cluster", "alab",
                 check=False, timeout=600)
        assert res.returncode == 0 and "Machines gone" in res.stdout, res.stdout + res.stderr
        assert set(new) & {m["metadata"]["name"] for m in machines(lab)} == set()
        assert not set(slurm_nodes()) & nodes, slurm_nodes()
        # site.yml keeps the Secret current: one changed by hand is written again from the converge's
        # inputs; the fast path of the next run (nothing changed) does not even read it
        core().patch_namespaced_secret(JOIN, NS, {"data": {"value": base64.b64encode(b"#cloud-config\n").decode()}},
                                       _content_type="application/strategic-merge-patch+json")
        res = LAB.playbook("site.yml", requested)
        assert res.returncode == 0, res.stdout[-3000:]
        assert "Write the Secret %s" % JOIN in changed_tasks(res.stdout, "localhost"), res.stdout[-3000:]
        assert base64.b64decode(core().read_namespaced_secret(JOIN, NS).data["value"]).decode() == value
        res = LAB.playbook("site.yml", requested)
        assert res.returncode == 0 and "nothing to do" in res.stdout, res.stdout[-3000:]
        assert "TASK [Read the cluster's MachineDeployments]" not in res.stdout, res.stdout[-3000:]
    finally:
        set_bootstrap(lab, MD)


@pytest.mark.gate
def test_no_secret_in_any_log(lab):
    token = open(os.path.join(STATE, "capi", "token")).read().strip()
    key = open(os.path.join(STATE, "capi", "munge.key"), "rb").read()  # served as a Secret to site.yml
    logs = os.path.join(STATE, "logs")
    assert "events.log" in os.listdir(logs)
    for name in os.listdir(logs):
        raw = open(os.path.join(logs, name), "rb").read()
        assert token.encode() not in raw, name
        assert key[:32] not in raw and base64.b64encode(key)[:40] not in raw, name
