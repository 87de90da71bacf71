"""keda_demand: the GJSON path KEDA's metrics-api scaler reads a partition's demand with (its value, read by
a real KEDA from a slurmrestd answer, is tested in tests/kube/test_keda.py)."""

import re

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.converged.hpc.plugins.filter.keda import HOLDING, RUNNABLE, keda_demand, keda_objects


def clauses(path):
    assert path.startswith("[") and path.endswith("]|@flatten|#"), path
    return path[1:-len("]|@flatten|#")].split(",")


def test_one_clause_per_state_or_reason_and_node_count():
    got = clauses(keda_demand("compute", 3))
    assert len(got) == 3 * (len(HOLDING) + len(RUNNABLE))
    for n in (1, 2, 3):
        ours = [c for c in got if c.endswith("#(node_count.number>=%d)#" % n)]
        assert len(ours) == len(HOLDING) + len(RUNNABLE)
        assert all(c.startswith('jobs.#(partition=="compute")#|') for c in ours)


def test_pending_counts_only_runnable_reasons_without_dependency():
    pending = [c for c in clauses(keda_demand("compute", 1)) if "PENDING" in c]
    reasons = sorted(re.search(r'state_reason=="([^"]+)"', c).group(1) for c in pending)
    assert reasons == sorted(RUNNABLE)
    assert all('#(dependency=="")#' in c for c in pending)
    assert not {"JobHeldUser", "JobHeldAdmin", "Dependency", "BeginTime", "Reservation"} & set(RUNNABLE)


def test_running_jobs_count_their_nodes():
    holding = [c for c in clauses(keda_demand("gpu", 2)) if "PENDING" not in c]
    assert sorted(holding) == sorted('jobs.#(partition=="gpu")#|#(job_state.0=="%s")#|#(node_count.number>=%d)#'
                                     % (state, n) for state in HOLDING for n in (1, 2))


@pytest.mark.parametrize("partition", ["", "a b", 'x")#', None, 3, "compute,gpu"])
def test_a_bad_partition_is_named(partition):
    with pytest.raises(AnsibleFilterError, match="partition %s" % re.escape(repr(partition))):
        keda_demand(partition, 2)


@pytest.mark.parametrize("max_nodes", [0, -1, 201, "3", 2.5, True, None])
def test_a_bad_max_is_named(max_nodes):
    with pytest.raises(AnsibleFilterError, match="max_nodes %s" % re.escape(repr(max_nodes))):
        keda_demand("compute", max_nodes)


URL = "http://10.0.0.1:6820/slurm/v0.0.42/jobs"


def test_objects_of_a_pool():
    got = keda_objects([{"deployment": "hpc-compute", "partition": "compute", "max": 4}], "metal3", URL)
    assert got["errors"] == []
    auth, scaled = got["objects"]
    assert auth["kind"] == "TriggerAuthentication" and auth["spec"]["secretTargetRef"] == [
        {"parameter": "apiKey", "name": "slurm-keda-token", "key": "token"}]
    spec = scaled["spec"]
    assert scaled["metadata"] == {"name": "hpc-compute", "namespace": "metal3",
                                  "labels": {"app.kubernetes.io/managed-by": "converged.hpc"}}
    assert spec["scaleTargetRef"] == {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                                      "name": "hpc-compute"}
    # KEDA's defaults unless given; the HPA's scale-down waits as long as the cooldown
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"], spec["cooldownPeriod"]) \
        == (0, 4, 30, 300)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 300}
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "metrics-api" and trigger["metricType"] == "AverageValue"
    assert trigger["authenticationRef"] == {"name": "slurmrestd"}
    assert trigger["metadata"] == {"url": URL, "format": "json", "authMode": "apiKey", "method": "header",
                                   "keyParamName": "X-SLURM-USER-TOKEN", "targetValue": "1",
                                   "valueLocation": keda_demand("compute", 4)}


@pytest.mark.parametrize("pools, namespace, url, named", [
    ([{"deployment": "hpc-compute", "partition": "compute", "max": 0}], "metal3", URL,
     "converged_keda_pools[0].max 0 is not a whole number from 1 to 200"),
    ([{"deployment": "hpc-compute", "partition": "compute", "max": 2, "min": 3}], "metal3", URL,
     "converged_keda_pools[0]: min 3 is above max 2"),
    ([{"deployment": "Hpc_Compute", "partition": "compute", "max": 2}], "metal3", URL,
     "converged_keda_pools[0].deployment 'Hpc_Compute' is not a MachineDeployment name"),
    ([{"deployment": "hpc-compute", "partition": "a b", "max": 2}], "metal3", URL,
     "converged_keda_pools[0].partition 'a b' is not a Slurm partition name"),
    ([{"deployment": "hpc-compute", "partition": "compute", "max": 2, "polling": "5"}], "metal3", URL,
     "converged_keda_pools[0].polling '5' is not a whole number from 1 to 86400"),
    ([{"deployment": "hpc-compute", "partition": "compute", "max": 2, "maximum": 3}], "metal3", URL,
     "converged_keda_pools[0]: unknown setting(s) maximum"),
    ([{"deployment": "a", "partition": "p", "max": 1}, {"deployment": "a", "partition": "q", "max": 1}], "metal3",
     URL, "converged_keda_pools[1]: MachineDeployment 'a' is given twice"),
    ([], "metal3", URL, "converged_keda_pools []: give a list of pools"),
    ([{"deployment": "a", "partition": "p", "max": 1}], "", URL, "namespace '' is not a Kubernetes namespace name"),
    ([{"deployment": "a", "partition": "p", "max": 1}], "metal3", "http://ctl:6820/slurm/v0.0.42/nodes",
     "url 'http://ctl:6820/slurm/v0.0.42/nodes' is not slurmrestd's jobs URL"),
])
def test_a_bad_setting_is_named_and_nothing_made(pools, namespace, url, named):
    # a good pool beside the bad one is not made either: all or nothing
    got = keda_objects(pools + [{"deployment": "good", "partition": "p", "max": 1}] if pools else pools,
                       namespace, url)
    assert got["objects"] == []
    assert any(error.startswith(named) for error in got["errors"]), got["errors"]
