"""A rollout of a new node image over a busy cluster, end to end in a lab of its own: real Slurm, the real
Cluster API, CAPM3 and Bare Metal Operator, and playbooks/rollout.yml deciding which Machine goes next.

The lab has 4 compute Machines on 4 hosts, no spare (bare metal: a new Machine gets the host an old one gave
back), joining Slurm at their first boot (LAB_COMPUTE_JOIN_AT_BOOT: the MachineDeployment OnDelete, its
template naming the join Secret). An image build is a Metal3MachineTemplate whose image URL ends in
?build=<name>: the host agent writes the name on the host's disk (/etc/converged-hpc/image-build), and a build
named *slurmd-fails* is an image whose slurmd never starts. Order matters (one lab, module scope): a wrong
request refused; a busy cluster rolled to v2 (every job COMPLETED 0:0, never fewer than 3 nodes in service);
a rollout to a broken image stopped after its first new Machine, then rolled back; a rollout with a deadline.
"""

import json
import os
import re
import time

import pytest
from kubernetes import client, config

from labkit import Lab, Poller, has_podman, wait_for

LAB = Lab("olab", "10.89.96", 16496, ".lab/e2e-rollout", LAB_COMPUTE="4", LAB_COMPUTE_HOSTS="4",
          LAB_COMPUTE_JOIN_AT_BOOT="1", LAB_DIRECTORY="0", LAB_RAM_MIB="1048576", LAB_LEAST_PRIVILEGE="1")
STATE = LAB.state
sh, on = LAB.sh, LAB.on
CTL = "olab-ctl-01"
NS, G, V = "metal3", "cluster.x-k8s.io", "v1beta2"
INFRA = "infrastructure.cluster.x-k8s.io"
MD = "olab-compute"
NOTE = "converged.hpc/rollout"
IN_SERVICE = {"idle", "alloc", "mix", "comp", "plnd", "resv", "maint"}


def serving(state):
    """sinfo's short state in service: one of IN_SERVICE, marked or not as planned by the backfill scheduler
    (-) or in a maintenance reservation ($); not responding (*), powered down or rebooting are not."""
    return state.rstrip("-$") in IN_SERVICE


pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up()
    co = client.CustomObjectsApi(config.new_client_from_config(os.path.join(STATE, "capi", "kubeconfig")))
    yield co
    LAB.down()


def deployment(co):
    return co.get_namespaced_custom_object(G, V, NS, "machinedeployments", MD)


def note(co):
    text = (deployment(co)["metadata"].get("annotations") or {}).get(NOTE)
    return json.loads(text) if text else {}


def machines(co):
    return co.list_namespaced_custom_object(G, V, NS, "machines",
                                            label_selector="cluster.x-k8s.io/deployment-name=" + MD)["items"]


def hostname(machine):
    return next((a["address"] for a in (machine.get("status") or {}).get("addresses") or []
                 if a["type"] == "Hostname"), None)


def make_template(co, name, build):
    """A copy of the compute template whose image is that build (the host agent reads ?build=)."""
    base = co.get_namespaced_custom_object(INFRA, "v1beta2", NS, "metal3machinetemplates", MD)
    spec = json.loads(json.dumps(base["spec"]))
    image = spec["template"]["spec"]["image"]
    image["url"] = image["url"].split("?")[0] + "?build=" + build
    body = {"apiVersion": INFRA + "/v1beta2", "kind": "Metal3MachineTemplate",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}
    co.create_namespaced_custom_object(INFRA, "v1beta2", NS, "metal3machinetemplates", body)


def compute_nodes():
    out = LAB.ask(CTL, "sinfo --noheader --Node --partition compute --format '%N %t'")
    return dict(line.split() for line in out.splitlines() if line.strip())


def builds(co):
    """The image build of each compute Machine's host ("" before any rollout)."""
    out = {}
    for machine in machines(co):
        host = hostname(machine)
        out[host] = on(host, "cat /etc/converged-hpc/image-build 2>/dev/null || true").stdout.strip()
    return out


class Sampler(Poller):
    """The compute nodes in service (serving: idle, allocated, mixed, completing, planned, reserved), every 2 s."""

    def __init__(self):
        super().__init__()
        self.samples = []

    def sample(self):
        res = on(CTL, "sinfo --noheader --Node --partition compute --format '%N %t'", check=False)
        if res.returncode == 0:
            states = [line.split()[1] for line in res.stdout.splitlines() if len(line.split()) == 2]
            self.samples.append((time.time(), len([s for s in states if serving(s)])))


def submit_busy_load():
    """Jobs of 30-120 s with time limits, a two-node job and an array: what a busy cluster runs."""
    jobs = []
    for seconds, nodes in ((120, 1), (90, 1), (60, 2), (45, 1), (30, 1), (100, 1)):
        jobs.append(on(CTL, "sbatch --parsable -N %d --time=%d --output=/tmp/ro-%%j.out --wrap 'sleep %d'"
                       % (nodes, seconds // 60 + 2, seconds)).stdout.strip())
    jobs.append(on(CTL, "sbatch --parsable --array=1-4 --time=2 --output=/tmp/ro-%A_%a.out --wrap 'sleep 40'")
                .stdout.strip())
    return jobs


def accounting(jobs):
    """(job id, state, exit code) of each job and array task in accounting."""
    out = LAB.ask(CTL, "sacct --noheader --parsable2 --allocations --format JobID,State,ExitCode --jobs %s"
                  % ",".join(jobs))
    return [tuple(line.split("|")) for line in out.splitlines() if line.strip()]


def wait_jobs_done(jobs, timeout=600):
    def done():
        rows = accounting(jobs)
        return rows if rows and all(r[1] not in ("PENDING", "RUNNING", "COMPLETING", "REQUEUED") for r in rows) \
            else None
    return wait_for("jobs %s to end" % ",".join(jobs), done, timeout, poll=5)


def rollout(*extra, timeout=1800):
    return LAB.sh(*LAB.playbook_args("rollout.yml", "converged_rollout_deployment=" + MD, *extra), check=False,
                  timeout=timeout)


@pytest.mark.gate
@pytest.mark.parametrize("extra, message", [
    (["converged_rollout_template=olab-compute-v9"],
     "converged_rollout_template=olab-compute-v9: no such Metal3MachineTemplate in namespace metal3"),
    (["converged_rollout_template=olab-compute", "converged_rollout_max_unavailable=0"],
     "converged_rollout_max_unavailable='0': expected a whole number, at least 1"),
    (["converged_rollout_back=true"], "has no rollout to go back from"),
    (["converged_rollout_template=olab-compute", "converged_rollout_bootstrap=no-such-secret"],
     "converged_rollout_bootstrap=no-such-secret: no such Secret in namespace metal3"),
])
def test_a_wrong_rollout_is_refused_before_any_change(lab, extra, message):
    before = deployment(lab)
    res = rollout(*extra)
    assert res.returncode != 0 and message in res.stdout, res.stdout[-3000:]
    after = deployment(lab)
    assert after["spec"] == before["spec"] and NOTE not in (after["metadata"].get("annotations") or {})


@pytest.mark.gate
def test_a_busy_cluster_rolls_to_a_new_image_with_every_job_run_to_its_end(lab):
    make_template(lab, MD + "-v2", "v2")
    first = {m["metadata"]["name"] for m in machines(lab)}
    assert len(first) == 4 and len(compute_nodes()) == 4
    jobs = submit_busy_load()
    wait_for("jobs to start", lambda: "alloc" in compute_nodes().values() or "mix" in compute_nodes().values(),
             120, poll=2)
    with Sampler() as sampler:
        t0 = time.time()
        res = rollout("converged_rollout_template=%s-v2" % MD, "converged_rollout_join_timeout=300")
        took = time.time() - t0
    assert res.returncode == 0, res.stdout[-6000:]
    rows = wait_jobs_done(jobs)
    assert rows and all(state == "COMPLETED" and code == "0:0" for _job, state, code in rows), rows
    assert len([r for r in rows if "_" in r[0]]) == 4  # the array's four tasks
    now = {m["metadata"]["name"]: m for m in machines(lab)}
    assert len(now) == 4 and not set(now) & first, sorted(now)
    assert set(builds(lab).values()) == {"v2"}, builds(lab)
    assert sorted(compute_nodes()) == sorted(hostname(m) for m in now.values())
    assert all(serving(state) for state in compute_nodes().values()), compute_nodes()
    # never fewer than replicas - max_unavailable in service
    assert sampler.samples and min(n for _t, n in sampler.samples) >= 3, sampler.samples
    done = note(lab)
    assert done["state"] == "done" and done["to"]["template"] == MD + "-v2" and done["from"]["template"] == MD
    assert deployment(lab)["spec"]["rollout"]["strategy"]["type"] == "OnDelete"
    with open(os.path.join(STATE, "logs", "rollout-figures.tsv"), "a") as fh:
        fh.write("busy rollout of 4\t%.0f s\tfewest in service %d\n" % (took, min(n for _t, n in sampler.samples)))
    # a second run asked the same finds nothing to do and changes nothing on the MachineDeployment
    again = rollout("converged_rollout_template=%s-v2" % MD)
    assert again.returncode == 0 and "every Machine runs the target" in again.stdout, again.stdout[-3000:]
    assert {m["metadata"]["name"] for m in machines(lab)} == set(now)


def test_a_broken_image_stops_after_its_first_machine_and_going_back_restores_the_cluster(lab):
    make_template(lab, MD + "-v3", "v3-slurmd-fails")
    before = {m["metadata"]["name"] for m in machines(lab)}
    jobs = [on(CTL, "sbatch --parsable --time=3 --output=/tmp/ro-%j.out --wrap 'sleep 60'").stdout.strip()]
    res = rollout("converged_rollout_template=%s-v3" % MD, "converged_rollout_join_timeout=120")
    assert res.returncode != 0, res.stdout[-4000:]
    found = re.search(r"stopped: new Machine\(s\) (\S+) did not join Slurm within 120 s", res.stdout)
    assert found and "converged_rollout_back=true" in res.stdout, res.stdout[-4000:]
    now = {m["metadata"]["name"] for m in machines(lab)}
    assert len(before - now) == 1 and len(now - before) == 1, (sorted(before), sorted(now))
    assert note(lab)["state"] == "stopped"
    # the three old nodes kept serving
    assert len([s for s in compute_nodes().values() if serving(s)]) == 3, compute_nodes()
    back = rollout("converged_rollout_back=true", "converged_rollout_join_timeout=300")
    assert back.returncode == 0, back.stdout[-6000:]
    assert set(builds(lab).values()) == {"v2"}, builds(lab)
    assert len(compute_nodes()) == 4 and all(serving(s) for s in compute_nodes().values()), compute_nodes()
    done = note(lab)
    assert done["state"] == "done" and done["to"]["template"] == MD + "-v2" and done["back"]
    rows = wait_jobs_done(jobs)
    assert all(state == "COMPLETED" and code == "0:0" for _job, state, code in rows), rows


def test_a_deadline_keeps_long_jobs_off_the_old_nodes(lab):
    make_template(lab, MD + "-v4", "v4")
    # a job whose time limit runs past the deadline, submitted once the deadline's reservation is there: it
    # must not start on an old node (it would hold the rollout past the deadline), so it runs on a new one -
    # and it fails anywhere else (the hosts keep their names: the image build tells a new node)
    proc = LAB.playbook_in_background("rollout.yml", os.path.join(STATE, "logs", "rollout-deadline.log"),
                                      "converged_rollout_deployment=" + MD, "converged_rollout_template=%s-v4" % MD,
                                      "converged_rollout_deadline=90", "converged_rollout_join_timeout=300")
    wait_for("the deadline's reservation", lambda: on(CTL, "scontrol show reservation converged-rollout-%s" % MD,
                                                      check=False).returncode == 0, 120, poll=2)
    long_job = on(CTL, "sbatch --parsable --time=10 --output=/tmp/ro-%j.out "
                       "--wrap 'sleep 20; grep -qx v4 /etc/converged-hpc/image-build'").stdout.strip()
    rc, out = LAB.finish_playbook(proc, os.path.join(STATE, "logs", "rollout-deadline.log"), 1500)
    assert rc == 0, out[-6000:]
    rows = wait_jobs_done([long_job])
    assert rows[0][1:] == ("COMPLETED", "0:0"), rows
    assert on(CTL, "scontrol show reservation converged-rollout-%s" % MD, check=False).returncode != 0
    assert set(builds(lab).values()) == {"v4"}, builds(lab)
