"""converged.hpc.capi_scale (module_utils/capi_scale.py) on a real kube-apiserver, every result read back from
the server: a scale-down marks its Machines first and lowers the replicas through /scale, a scale-up
writes its annotation, replicas changed by someone else change nothing, a refused scale puts back what
it wrote, a stale mark is taken back (a pending deletion's is not), check mode stores nothing, and bad
input fails before any write. Then through ansible-playbook, as autoscale.yml runs it."""

import json
import subprocess
import sys

import pytest

from conftest import ADMIN_TOKEN, MARKER_TOKEN, REPO, ansible_env, load_metal3

from ansible_collections.converged.hpc.plugins.module_utils.capi_scale import SCALE_ARGUMENT_SPEC, scale_task

API = "cluster.x-k8s.io/v1beta2"
MARK = "cluster.x-k8s.io/delete-machine"
REASON = "converged.hpc autoscale: idle"
STAMP = "converged.hpc/scaled-up-at"
# the fixture's hpc-compute: 5 replicas, 5 Machines not being deleted (and pqrst, being deleted)
ALIVE = ["hpc-compute-7d9f8-abcde", "hpc-compute-7d9f8-fghij", "hpc-compute-7d9f8-klmno",
         "hpc-compute-7d9f8-uvwxy", "hpc-compute-7d9f8-zb4ct"]


@pytest.fixture
def ns(backend):
    return load_metal3(backend.api(), backend.namespace())


def scale(backend, ns, token=ADMIN_TOKEN, check_mode=False, **given):
    params = {k: v.get("default") for k, v in SCALE_ARGUMENT_SPEC.items()}
    params.update(name="hpc-compute", namespace=ns, delete_reason=REASON, **backend.auth(token))
    params.update(given)
    result = scale_task(params, check_mode)
    assert token not in json.dumps(result)
    return result


def replicas(backend, ns):
    # (a Scale omits spec.replicas when it is 0: autoscaling/v1's omitempty)
    return backend.api().ok("GET", "/apis/%s/namespaces/%s/machinedeployments/hpc-compute/scale"
                            % (API, ns))["spec"].get("replicas", 0)


def deployment(backend, ns):
    return backend.api().get(API, "machinedeployments", ns, "hpc-compute")


def marks(backend, ns):
    return {m["metadata"]["name"]: m["metadata"]["annotations"][MARK] for m in backend.api().list(API, "machines", ns)
            if MARK in (m["metadata"].get("annotations") or {})}


def mark_by_hand(backend, ns, name, value):
    backend.api().patch(API, "machines", ns, name, {"metadata": {"annotations": {MARK: value}}})


def test_a_scale_down_marks_its_machines_then_lowers_the_replicas(backend, ns):
    res = scale(backend, ns, current_replicas=5, replicas=3, delete_machines=ALIVE[:2])
    assert res["changed"] is True and (res["replicas"], res["desired"], res["marked"]) == (5, 3, ALIVE[:2]), res
    assert replicas(backend, ns) == 3
    assert marks(backend, ns) == {ALIVE[0]: REASON, ALIVE[1]: REASON}
    # the deletion Cluster API now owes (5 Machines for 3 replicas) keeps the marks; the same decision
    # again is a conflict: the replicas are not those it was made from
    again = scale(backend, ns, current_replicas=5, replicas=3, delete_machines=ALIVE[:2])
    assert again["changed"] is False and again["conflict"] is True and "has 3 replicas, not the 5" in again["msg"]
    assert again["warnings"] == [again["msg"]] and replicas(backend, ns) == 3
    assert scale(backend, ns, replicas=3)["unmarked"] == [] and len(marks(backend, ns)) == 2


def test_a_scale_up_writes_its_annotation_with_the_replicas(backend, ns):
    res = scale(backend, ns, current_replicas=5, replicas=7, annotations={STAMP: "1790000000"})
    assert res["changed"] is True and res["marked"] == []
    assert replicas(backend, ns) == 7
    assert deployment(backend, ns)["metadata"]["annotations"][STAMP] == "1790000000"
    same = scale(backend, ns, current_replicas=7, replicas=7)
    assert same["changed"] is False and same["conflict"] is False


def test_from_zero_replicas_up_with_its_annotation(backend, ns):
    # at 0 a real server's Scale has no spec.replicas: the write cannot test it (a JSON patch test of a
    # missing value fails, 422), it tests the object's version read after its own annotation
    backend.api().patch(API, "machinedeployments", ns, "hpc-compute", {"spec": {"replicas": 0}})
    scale_of = backend.api().ok("GET", "/apis/%s/namespaces/%s/machinedeployments/hpc-compute/scale" % (API, ns))
    assert "replicas" not in scale_of["spec"], scale_of
    res = scale(backend, ns, current_replicas=0, replicas=2, annotations={STAMP: "1790000001"})
    assert res["changed"] is True and (res["replicas"], res["desired"]) == (0, 2), res
    assert replicas(backend, ns) == 2
    assert deployment(backend, ns)["metadata"]["annotations"][STAMP] == "1790000001"
    # a decision made at 0 when the replicas are no longer 0: nothing changes
    again = scale(backend, ns, current_replicas=0, replicas=3)
    assert again["changed"] is False and again["conflict"] is True and replicas(backend, ns) == 2


def test_a_refused_scale_puts_back_its_marks_and_annotations(backend, ns):
    # this token may mark Machines and read the scale, not change it: the patch of /scale is refused (403)
    res = scale(backend, ns, MARKER_TOKEN, current_replicas=5, replicas=4, delete_machines=[ALIVE[2]])
    assert res.get("failed") is True, res
    assert "changing its replicas 5 -> 4 failed with HTTP 403" in res["msg"]
    assert 'cannot patch resource \\"machinedeployments/scale\\"' in res["msg"] \
        or 'cannot patch resource "machinedeployments/scale"' in res["msg"], res["msg"]
    assert "what it had written was taken back" in res["msg"]
    assert marks(backend, ns) == {} and replicas(backend, ns) == 5
    # annotations it may not write: refused before any mark
    res = scale(backend, ns, MARKER_TOKEN, current_replicas=5, replicas=6, annotations={STAMP: "1"})
    assert res.get("failed") is True and "writing its annotations failed with HTTP 403" in res["msg"], res
    assert STAMP not in (deployment(backend, ns)["metadata"].get("annotations") or {})


def test_a_stale_mark_is_taken_back_a_pending_deletions_is_kept(backend, ns):
    # a mark a failed run could not take back: no deletion is pending (5 Machines, 5 replicas)
    mark_by_hand(backend, ns, ALIVE[3], REASON)
    mark_by_hand(backend, ns, ALIVE[4], "the site's own")  # not ours: never touched
    res = scale(backend, ns, current_replicas=5, replicas=5)
    assert res["changed"] is True and res["unmarked"] == [ALIVE[3]]
    assert marks(backend, ns) == {ALIVE[4]: "the site's own"}
    # Cluster API owes a deletion (replicas lowered by hand): the mark it will honour stays
    mark_by_hand(backend, ns, ALIVE[3], REASON)
    backend.api().patch(API, "machinedeployments", ns, "hpc-compute", {"spec": {"replicas": 4}}, sub="scale")
    res = scale(backend, ns, replicas=4)
    assert res["changed"] is False and res["unmarked"] == [] and marks(backend, ns)[ALIVE[3]] == REASON


def test_check_mode_is_a_dry_run(backend, ns):
    before = deployment(backend, ns)["metadata"]["resourceVersion"]
    res = scale(backend, ns, check_mode=True, current_replicas=5, replicas=4, delete_machines=[ALIVE[0]],
                annotations={STAMP: "2"})
    assert res["changed"] is True and res["desired"] == 4, res
    assert replicas(backend, ns) == 5 and marks(backend, ns) == {}
    assert deployment(backend, ns)["metadata"]["resourceVersion"] == before
    # the server checked it: a refused write fails in check mode too
    res = scale(backend, ns, MARKER_TOKEN, check_mode=True, current_replicas=5, replicas=4)
    assert res.get("failed") is True and "HTTP 403" in res["msg"] and "check mode" in res["msg"], res


@pytest.mark.parametrize("given,message", [
    (dict(replicas=-1), "replicas -1: must be 0 or more"),
    (dict(replicas=6, delete_machines=[ALIVE[0]]), "only with a scale-down, and 5 -> 6 is not one"),
    (dict(replicas=4, delete_machines=ALIVE[:2]), "2 Machines to delete"),
    (dict(replicas=4, delete_machines=["hpc-controller-5c6b9-x7k2p"]), "is not one of its Machines"),
    (dict(replicas=4, delete_machines=["hpc-compute-7d9f8-pqrst"]), "is already being deleted"),
    (dict(replicas=3, delete_machines=[ALIVE[0], ALIVE[0]]), "names a Machine twice"),
    (dict(replicas=3, name="nope"), "MachineDeployment %s/nope does not exist"),
])
def test_bad_input_fails_before_any_write(backend, ns, given, message):
    before = deployment(backend, ns)["metadata"]["resourceVersion"]
    res = scale(backend, ns, **given)
    assert res.get("failed") is True and message.replace("%s", ns) in res["msg"], res
    assert replicas(backend, ns) == 5 and marks(backend, ns) == {}
    assert deployment(backend, ns)["metadata"]["resourceVersion"] == before


PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Scale as autoscale.yml does
      converged.hpc.capi_scale:
        name: hpc-compute
        namespace: {ns}
        current_replicas: {current}
        replicas: {desired}
        delete_machines: [{victim}]
        delete_reason: "{reason}"
      register: scaled{environment}
    - name: Say what it did
      ansible.builtin.debug:
        msg: "SCALED {{{{ scaled | to_json }}}}"
"""


def test_in_ansibles_own_process_and_as_a_module(backend, ns, tmp_path):
    path = tmp_path / "play.yml"
    path.write_text(PLAY.format(ns=ns, current=5, desired=4, victim=ALIVE[0], reason=REASON, environment=""))
    env = ansible_env(**backend.auth_env())
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path),
                           "-e", "ansible_python_interpreter=/nonexistent/python3"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "changed: [localhost]" in proc.stdout, proc.stdout[-3000:]
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr
    assert replicas(backend, ns) == 4 and marks(backend, ns) == {ALIVE[0]: REASON}
    # the module itself (a task with an environment runs it, in a Python of its own)
    path.write_text(PLAY.format(ns=ns, current=4, desired=3, victim=ALIVE[1], reason=REASON,
                                environment="\n      environment:\n        SCALED_BY: module"))
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path),
                           "-e", "ansible_python_interpreter=" + sys.executable], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "changed: [localhost]" in proc.stdout, proc.stdout[-3000:]
    assert replicas(backend, ns) == 3 and set(marks(backend, ns)) == set(ALIVE[:2])
    # a conflict is a warning, nothing changed
    proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path),
                           "-e", "ansible_python_interpreter=" + sys.executable], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout[-3000:]
    assert "[WARNING]: MachineDeployment %s/hpc-compute has 3 replicas, not the 4" % ns in proc.stderr + proc.stdout
    assert "deprecat" not in (proc.stderr + proc.stdout).lower()
