"""The main job on the newest and the oldest ansible-core the collection supports, in a lab of their own (one
after the other): `make lab`'s shape (one controller, two compute nodes, accounting and REST on the
controller, no directory), every playbook run by that core. The newest, 2.21, runs on a Python 3.12+ control
node (tests/ansible_core.sh takes the newest the machine has: 3.13 here, with its strict X.509 checks of the
management cluster's certificates); 2.16 is the oldest claimed (meta/runtime.yml). On each: site.yml and
validate.yml (the lab's converge), a whole converge again (converged_skip_unchanged=false: what broke
accounting on 2.21, every host rendered with one host's facts) that changes nothing but the stamp, slurmdbd.conf
naming the controller, validate.yml with accounting and REST, a plain converge that finds nothing to do."""

import os
import re

import pytest

from labkit import Lab, ansible_core_path, has_podman, oldest_ansible_core

NEWEST = "2.21"
CORES = [NEWEST, oldest_ansible_core()]
CTL = "klab-ctl-01"
COMPUTE = ["klab-cn-01", "klab-cn-02"]

pytestmark = pytest.mark.skipif(not has_podman(), reason="needs podman")


@pytest.fixture(scope="module", params=CORES, ids=["ansible-core-%s" % c for c in CORES])
def lab(request):
    core = request.param
    lab = Lab("klab", "10.89.94", 16494, ".lab/e2e-cores", LAB_COMPUTE="2", LAB_DIRECTORY="0")
    lab.env["PATH"] = ansible_core_path(core)
    lab.core = core
    lab.up()
    yield lab
    lab.down()


def changed_tasks(out):
    """(host, task) of every task that reported changed."""
    found, task = [], None
    for line in out.splitlines():
        head = re.match(r"TASK \[(.*)\]", line)
        if head:
            task = head.group(1)
        hit = re.match(r"changed: \[([^\]]+)\]", line)
        if hit and task:
            found.append((hit.group(1).split(" ")[0], task))
    return found


def test_the_core_is_the_one_asked_for(lab):
    out = lab.sh("ansible", "--version").stdout
    assert out.splitlines()[0].startswith("ansible [core %s." % lab.core), out
    site = open(os.path.join(lab.state, "logs", "site.log")).read()
    assert "failed=0" in site and "unreachable=0" in site, site[-3000:]
    # the accounting database made by the newest collection this core's ansible package has (community.mysql's
    # MariaDB modules are deprecated in ansible 14, the 2.21 one; the 2.16 one has only community.mysql)
    modules = "ansible.mariadb" if lab.core == NEWEST else "community.mysql"
    assert "TASK [converged.hpc.mariadb : Create the databases and users with %s]" % modules in site, site[-3000:]


def test_a_whole_converge_again_changes_nothing_and_names_each_hosts_own_values(lab):
    res = lab.playbook("site.yml", "converged_skip_unchanged=false")
    assert res.returncode == 0, res.stdout[-4000:]
    changed = [(h, t) for h, t in changed_tasks(res.stdout) if "Record the host's state" not in t]
    assert changed == [], "%s\n%s" % (changed, res.stdout[-3000:])
    # slurmdbd.conf names the controller that runs it (on 2.21 without the contract's fix: a compute node)
    hostname = lab.on(CTL, "hostname").stdout.strip()
    conf = lab.on(CTL, "cat /etc/slurm/slurmdbd.conf").stdout
    # (only its DbdHost lines in a failure: the file holds the database's password)
    assert "DbdHost=%s\n" % hostname in conf, [line for line in conf.splitlines() if line.startswith("DbdHost")]
    assert lab.on(CTL, "systemctl is-active slurmdbd").stdout.strip() == "active"
    for node in COMPUTE:
        options = lab.on(node, "cat /etc/default/slurmd").stdout
        assert "-N %s " % node in options, options


def test_validate_with_accounting_and_rest(lab):
    res = lab.playbook("validate.yml")
    assert res.returncode == 0, res.stdout[-4000:]
    assert re.search(r"accounting: sacct job \d+", res.stdout), res.stdout[-3000:]
    assert re.search(r"REST: slurmrestd v0\.0\.\d+ on port", res.stdout), res.stdout[-3000:]


def test_a_plain_converge_has_nothing_to_do(lab):
    res = lab.playbook("site.yml")
    assert res.returncode == 0 and "nothing to do" in res.stdout, res.stdout[-3000:]
    assert changed_tasks(res.stdout) == [], res.stdout[-3000:]
