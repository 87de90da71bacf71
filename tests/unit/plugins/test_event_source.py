"""The event source's pure part (extensions/eda/plugins/event_source/capi_machines.py): which change of a
Machine is a transition worth an event. Its watch is tested on a real kube-apiserver
(tests/kube/test_kube_event_source.py)."""

from ansible_collections.converged.hpc.extensions.eda.plugins.event_source import capi_machines as source


def test_transitions():
    up = {"phase": "Provisioned", "deleting": False, "hooked": True, "node_type": "compute", "features": []}
    assert source.transition(None, up) == "up"
    assert source.transition(dict(up, phase="Provisioning"), up) == "up"
    assert source.transition(up, up) is None
    assert source.transition(up, dict(up, deleting=True)) == "deleting"
    assert source.transition(dict(up, deleting=True), dict(up, deleting=True)) is None
    assert source.transition(up, dict(up, deleting=True, hooked=False)) is None  # not ours to hold
    assert source.transition(up, dict(up, features=["feature.slurm.converged.hpc/gpu=true"])) == "relabelled"
    assert source.transition(up, dict(up, node_type="login")) == "relabelled"
