"""converged.hpc.pool_info (module_utils/capi_pool.py) on a real kube-apiserver: a pool's four lists at
once, without managedFields; only the kinds asked, the Machines a label selector names; a bad API version
named before any request, and a token that may not list what is asked named with the server's refusal."""

import json

import pytest

from conftest import ADMIN_TOKEN, READONLY_TOKEN, load_metal3

from ansible_collections.converged.hpc.plugins.module_utils.capi_pool import POOL_INFO_ARGUMENT_SPEC, pool_info_task


@pytest.fixture
def ns(backend):
    return load_metal3(backend.api(), backend.namespace())


def info(backend, ns, token=ADMIN_TOKEN, **given):
    params = {k: v.get("default") for k, v in POOL_INFO_ARGUMENT_SPEC.items()}
    params.update(namespace=ns, **backend.auth(token))
    params.update(given)
    result = pool_info_task(params, False)
    assert token not in json.dumps(result)
    return result


def test_the_pool_at_once_and_only_what_is_asked(backend, ns):
    out = info(backend, ns)
    assert not out.get("failed"), out
    assert sorted(d["metadata"]["name"] for d in out["deployments"]) == ["hpc-compute", "hpc-controller"]
    assert out["templates"] == [] and len(out["hosts"]) == 8 and len(out["machines"]) == 8
    assert all("managedFields" not in o["metadata"] for o in out["machines"] + out["hosts"])
    out = info(backend, ns, kinds=["machines"], machine_selector="cluster.x-k8s.io/deployment-name=hpc-compute")
    assert sorted(out) == ["changed", "machines"] and len(out["machines"]) == 6


def test_bad_input_and_missing_rights_are_named(backend, ns):
    out = info(backend, ns, api_version="v1beta2")
    assert out["failed"] and out["msg"] == "api_version 'v1beta2': expected group/version"
    out = info(backend, ns, token=READONLY_TOKEN)  # may list Machines, nothing else
    assert out["failed"] and "403" in out["msg"] and "machinedeployments" in out["msg"], out
    assert sorted(info(backend, ns, token=READONLY_TOKEN, kinds=["machines"])) == ["changed", "machines"]
