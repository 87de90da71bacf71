"""KEDA as the autoscaler, end to end in a lab of its own: real Slurm with slurmrestd, the real Cluster API,
CAPM3 and Bare Metal Operator, and KEDA v2.21 with kube-controller-manager's HPA controller in the management
cluster (LAB_KEDA=1; make kube-assets KEDA=1 builds them).

playbooks/keda.yml writes what docs/autoscale.md shows: a token of slurm-keda made by scontrol token in a
Secret, the TriggerAuthentication naming it, a ScaledObject on the compute MachineDeployment (0 replicas,
LAB_COMPUTE=0) whose metrics-api trigger reads the compute partition's demand from the controller's
slurmrestd. Nobody runs a playbook afterwards: KEDA scales, and ansible-rulebook (the reconcile rulebook)
joins the new Machines and drains and releases the leaving ones. Order matters (one lab, module scope).
"""

import base64
import json
import os
import re
import time
import urllib.parse
import urllib.request

import pytest
from kubernetes import client, config

import kubeapi
from labkit import Lab, has_podman, wait_for

LAB = Lab("kdlab", "10.89.89", 16489, ".lab/e2e-keda", LAB_COMPUTE="0", LAB_DIRECTORY="0", LAB_KEDA="1",
          LAB_RAM_MIB="1048576", LAB_LEAST_PRIVILEGE="1")
STATE = LAB.state
sh, on = LAB.sh, LAB.on
CTL = "kdlab-ctl-01"
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
MD = "kdlab-compute"
POLLING, COOLDOWN, MAX = 5, 60, 3
POOLS = [{"deployment": MD, "partition": "compute", "max": MAX, "polling": POLLING, "cooldown": COOLDOWN}]

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    with open(os.path.join(STATE, "group_vars", "all", "keda.yml"), "w") as fh:
        fh.write("converged_keda_pools: %s\n" % json.dumps(POOLS))
    yield client.CustomObjectsApi(config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig")))
    sh("lab/lab.sh", "events-stop", check=False)
    LAB.down()


def admin():
    return kubeapi.api_from_kubeconfig(os.path.join(STATE, "capi", "kubeconfig"))


def replicas(co):
    return co.get_namespaced_custom_object(G, V, NS, "machinedeployments", MD)["spec"]["replicas"]


def machines(co):
    return co.list_namespaced_custom_object(G, V, NS, "machines",
                                            label_selector="cluster.x-k8s.io/deployment-name=" + MD)["items"]


def slurm_nodes():
    out = LAB.ask(CTL, "sinfo --noheader --Node --format '%N %t'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def demand():
    """What KEDA serves for the ScaledObject's metric through the aggregator (what the HPA reads), or None."""
    api = admin()
    scaled = api.get("keda.sh/v1alpha1", "scaledobjects", NS, MD) or {}
    names = (scaled.get("status") or {}).get("externalMetricNames") or []
    if not names:
        return None
    items = api.ok("GET", "/apis/external.metrics.k8s.io/v1beta1/namespaces/%s/%s"
                   % (NS, urllib.parse.quote(names[0], safe="")),
                   query={"labelSelector": "scaledobject.keda.sh/name=" + MD})["items"]
    return items[0]["value"] if items else None


def keda_log():
    path = os.path.join(STATE, "logs", "keda-operator.log")
    return open(path, errors="replace").read() if os.path.exists(path) else ""


def events_log():
    path = os.path.join(STATE, "logs", "events.log")
    return open(path).read() if os.path.exists(path) else ""


def wait(what, predicate, timeout, poll=2):
    return wait_for(what, predicate, timeout, poll, explain=lambda: "Slurm: %s\nKEDA:\n%s\nevents:\n%s" % (
        slurm_nodes(), keda_log()[-3000:], events_log()[-3000:]))


def keda_yml(*extra):
    res = LAB.playbook("keda.yml", *extra)
    with open(os.path.join(STATE, "logs", "keda.log"), "a") as fh:
        fh.write(res.stdout + res.stderr)
    return res


def test_keda_yml_makes_the_token_and_the_scaled_object_then_changes_nothing(lab):
    res = keda_yml()
    assert res.returncode == 0, res.stdout[-3000:]
    assert "KEDA: %s in %s by http://" % (MD, NS) in res.stdout and "token of slurm-keda made again" in res.stdout, \
        res.stdout[-3000:]
    api = admin()
    token = base64.b64decode(api.get("v1", "secrets", NS, "slurm-keda-token")["data"]["token"]).decode()
    assert re.match(r"^[\w-]+\.[\w-]+\.[\w-]+$", token) and token not in res.stdout + res.stderr
    # slurmrestd takes it alone (no user name header): the jobs, at the URL KEDA asks, from where KEDA runs
    url = api.get("keda.sh/v1alpha1", "scaledobjects", NS, MD)["spec"]["triggers"][0]["metadata"]["url"]
    assert url.endswith(":6820/slurm/v0.0.42/jobs"), url
    with urllib.request.urlopen(urllib.request.Request(url, headers={"X-SLURM-USER-TOKEN": token}), timeout=30) as resp:
        assert resp.status == 200 and "jobs" in json.load(resp)
    again = keda_yml()
    assert again.returncode == 0 and "token of slurm-keda kept" in again.stdout, again.stdout[-3000:]
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0 ", again.stdout), again.stdout[-2000:]
    assert re.search(r"%s\s+: ok=\d+\s+changed=0 " % CTL, again.stdout), again.stdout[-2000:]
    wait("the ScaledObject Ready", lambda: any(
        c["type"] == "Ready" and c["status"] == "True" for c in ((admin().get(
            "keda.sh/v1alpha1", "scaledobjects", NS, MD) or {}).get("status") or {}).get("conditions") or []), 120)
    sh("lab/lab.sh", "events")  # the reconcile rulebook: joins what KEDA makes, releases what it takes away


def test_held_and_dependent_jobs_scale_nothing(lab):
    held = on(CTL, "sbatch --parsable --hold --wrap 'sleep 1'").stdout.strip()
    dependent = on(CTL, "sbatch --parsable --dependency=afterok:%s --wrap 'sleep 1'" % held).stdout.strip()
    # KEDA polls every 5 s: three of its answers after both jobs are in the queue
    time.sleep(3 * POLLING)
    assert demand() == "0"
    assert replicas(lab) == 0 and machines(lab) == []
    on(CTL, "scancel %s %s" % (held, dependent))


def test_three_jobs_grow_the_pool_to_max_run_to_their_end_and_it_shrinks_to_zero(lab):
    jobs = on(CTL, "for n in 1 1 2; do sbatch --parsable -N $n -t 5 --output=/tmp/kd-%j.out "
                   "--wrap 'sleep 20; hostname'; done").stdout.split()
    assert len(jobs) == 3, jobs
    started = time.time()
    peak, first_running, busy_deleted, ended = [0], [None], set(), {}

    def watch():
        peak[0] = max(peak[0], replicas(lab))
        nodes = slurm_nodes()
        for m in machines(lab):
            name = m["metadata"]["name"]
            if m["metadata"].get("deletionTimestamp") and nodes.get(name) in ("alloc", "mix", "comp"):
                busy_deleted.add(name)  # held by our hook until its job ends
        for j in jobs:
            if j not in ended:
                state = LAB.job_state(CTL, j)  # None: slurmctld no longer holds it (ended; sacct has it)
                if state is None or state[0] == "COMPLETED":
                    ended[j] = state[0] if state else "gone"
                elif state[0] == "RUNNING" and first_running[0] is None:
                    first_running[0] = time.time() - started
        return len(ended) == len(jobs)

    wait("every job completed", watch, 900)
    done = time.time() - started
    assert set(ended.values()) <= {"COMPLETED", "gone"}, ended
    assert peak[0] == MAX
    wait("KEDA back at 0 and the Machines gone", lambda: watch() and replicas(lab) == 0 and not machines(lab)
         and not slurm_nodes(), COOLDOWN + 600)
    zero = time.time() - started
    sacct = on(CTL, "sacct --noheader --allocations --parsable2 --format JobID,State,ExitCode --jobs %s"
               % ",".join(jobs)).stdout.split()
    assert sorted(sacct) == sorted("%s|COMPLETED|0:0" % j for j in jobs), sacct
    with open(os.path.join(STATE, "logs", "keda-figures.tsv"), "a") as fh:
        fh.write("KEDA polling %d s cooldown %d s, jobs 1+1+2 nodes\tfirst RUNNING %.1f s\tall done %.1f s\t"
                 "back to 0 %.1f s\tbusy Machines deleted (held by the hook) %d\n"
                 % (POLLING, COOLDOWN, first_running[0] or -1, done, zero, len(busy_deleted)))


def test_no_token_in_any_log(lab):
    token = base64.b64decode(admin().get("v1", "secrets", NS, "slurm-keda-token")["data"]["token"])
    for name in os.listdir(os.path.join(STATE, "logs")):
        path = os.path.join(STATE, "logs", name)
        if os.path.isfile(path):
            with open(path, "rb") as fh:
                assert token not in fh.read(), "the KEDA token is in %s" % path
