"""Two Slurm clusters on one management cluster (the real controllers serving both Cluster API
clusters), converged independently through one inventory: neither touches the other.

tlab-1 = tlab-ctl-01 + tlab-cn-01, tlab-2 = tlab-ctl-02 + tlab-cn-02 (lab/capi_objects.py
--clusters 2 deals the machines out in turn).
"""

import re

import pytest

from labkit import Lab, has_podman

LAB = Lab("tlab", "10.89.86", 16486, ".lab/e2e-two", LAB_CONTROLLERS="2", LAB_COMPUTE="2", LAB_CLUSTERS="2",
          LAB_DIRECTORY="0", LAB_MUNGE_KEY_SOURCE="generate")
ONE = {"ctl": "tlab-ctl-01", "cn": "tlab-cn-01", "name": "tlab-1"}
TWO = {"ctl": "tlab-ctl-02", "cn": "tlab-cn-02", "name": "tlab-2"}
NO_NFS = "converged_nfs=false"

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module")
def lab():
    LAB.up(converge=False)
    yield LAB
    LAB.down()


def untouched(machine):
    """No munge key placed, no slurm.conf, no Slurm daemon running: never converged."""
    out = LAB.on(machine, "test -e /etc/munge/munge.key && echo key; test -e /etc/slurm/slurm.conf && echo conf; "
                          "test -e /etc/default/slurmd && grep -q -- -Z /etc/default/slurmd && echo slurmd; "
                          "systemctl is-active munge slurmctld slurmd || true").stdout.split()
    return out == ["inactive", "inactive", "inactive"]


def nodes(ctl):
    return LAB.ask(ctl, "sinfo --noheader --Node --format '%N %t'").split()


def main_pid(machine, unit):
    return LAB.on(machine, "systemctl show -p MainPID --value " + unit).stdout.strip()


def test_one_run_over_two_clusters_fails_before_any_change(lab):
    res = lab.playbook("site.yml", NO_NFS)
    assert res.returncode != 0
    assert "belong to 2 Cluster API clusters (tlab-1, tlab-2)" in res.stdout
    assert "--limit capi_cluster_<name>" in res.stdout
    for machine in (ONE["ctl"], ONE["cn"], TWO["ctl"], TWO["cn"]):
        assert untouched(machine), machine


def test_converge_the_first_cluster_alone(lab):
    res = lab.playbook("site.yml", NO_NFS, limit="capi_cluster_tlab_1")
    assert res.returncode == 0, res.stdout[-3000:]
    assert nodes(ONE["ctl"]) == [ONE["cn"], "idle"]
    assert "ClusterName=tlab-1" in lab.on(ONE["ctl"], "cat /etc/slurm/slurm.conf").stdout
    assert untouched(TWO["ctl"]) and untouched(TWO["cn"])


def test_converge_the_second_cluster_without_touching_the_first(lab):
    before = (main_pid(ONE["ctl"], "slurmctld"), main_pid(ONE["cn"], "slurmd"), main_pid(ONE["cn"], "munge"))
    res = lab.playbook("site.yml", NO_NFS, "converged_cluster=tlab-2")
    assert res.returncode == 0, res.stdout[-3000:]
    # the first cluster's hosts were only sorted by the contract (once, on the Ansible controller): no
    # task ran on them (they are not even in the recap), and nothing changed
    for host in (ONE["ctl"], ONE["cn"]):
        assert not re.search(r"^(ok|changed|fatal): \[%s\]" % host, res.stdout, re.M), host
        recap = [line for line in res.stdout.splitlines() if line.startswith(host + " ")]
        assert not recap or " changed=0 " in recap[-1], recap
    assert nodes(TWO["ctl"]) == [TWO["cn"], "idle"]
    assert nodes(ONE["ctl"]) == [ONE["cn"], "idle"]
    assert (main_pid(ONE["ctl"], "slurmctld"), main_pid(ONE["cn"], "slurmd"), main_pid(ONE["cn"], "munge")) == before
    # each cluster has a key of its own: a credential of one does not decode in the other
    keys = {c["name"]: lab.on(c["ctl"], "sha256sum /etc/munge/munge.key").stdout.split()[0] for c in (ONE, TWO)}
    assert keys["tlab-1"] != keys["tlab-2"]
    cred = lab.on(ONE["ctl"], "munge --no-input").stdout
    assert lab.sh("podman", "exec", "-i", TWO["cn"], "unmunge", check=False, input_text=cred).returncode != 0


def test_each_cluster_validates_and_runs_jobs_on_its_own_nodes(lab):
    for cluster in (ONE, TWO):
        res = lab.playbook("validate.yml", limit="capi_cluster_" + cluster["name"].replace("-", "_"))
        assert res.returncode == 0, res.stdout[-3000:]
        out = lab.on(cluster["ctl"], "srun --nodes=1 hostname --short").stdout.split()
        assert out == [cluster["cn"]]
