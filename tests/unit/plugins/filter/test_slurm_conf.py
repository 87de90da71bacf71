"""slurm.conf-style key=value rendering, shared by slurm.conf, partitions and slurmd --conf."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.slurm_conf import slurm_conf


def test_order_lists_booleans_and_empty_values():
    settings = {"PartitionName": "compute", "Nodes": ["a", "b"], "Default": True, "Hidden": False,
                "TreeWidth": "", "Extra": None, "SchedulerParameters": [], "MaxTime": "INFINITE", "Weight": 10}
    assert slurm_conf(settings) == "PartitionName=compute Nodes=a,b Default=YES Hidden=NO MaxTime=INFINITE Weight=10"
    assert slurm_conf({"A": 1, "B": 2}, "\n") == "A=1\nB=2"


def test_whitespace_in_a_value_is_refused_unless_quoted():
    with pytest.raises(AnsibleFilterError, match="Feature='a b' holds whitespace"):
        slurm_conf({"Feature": "a b"})
    assert slurm_conf({"Reason": 'node "x" down'}, quote=["Reason"]) == 'Reason="node \\"x\\" down"'
