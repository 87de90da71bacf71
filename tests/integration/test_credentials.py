"""Credentials never cross between clients in one process, on a real kube-apiserver.

ansible-playbook's own process loads the inventory's kubeconfig (and kubernetes.core's lookups load
theirs there too); one ansible-rulebook runs several event sources. The kubernetes library keeps a
process-wide default configuration that load_kube_config replaces, token-refresh hook included: a
client built from it later with host and api_key sent the kubeconfig's token instead. Here each
client is built from a configuration of its own: the token given is the token sent."""

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from conftest import ADMIN_TOKEN, HOOK, READONLY_TOKEN, make_machine, reasons, run_source

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiReader, build_configuration
from ansible_collections.converged.hpc.plugins.module_utils.capi_hook import hook_task

API = "cluster.x-k8s.io/v1beta2"


@pytest.fixture
def admin_loaded(backend, tmp_path):
    """An admin kubeconfig loaded in this process as a kubeconfig user would (the library's default
    configuration, as kubernetes.core's lookups load it, and the collection's own client); put back after."""
    path = backend.kubeconfig(tmp_path / "admin.kubeconfig", ADMIN_TOKEN)
    k8s_config.load_kube_config(config_file=path)
    configuration, headers = build_configuration(kubeconfig=path)
    reader = CapiReader(configuration, headers=headers)
    assert reader.request("/apis/%s/machines" % API)[0] == 200
    reader.close()
    yield path
    k8s_client.Configuration.set_default(None)


def test_a_token_that_may_only_read_cannot_write_after_an_admin_kubeconfig(backend, admin_loaded):
    ns = backend.namespace()
    make_machine(backend.api(), ns, "cn-1")
    params = dict(name="cn-1", namespace=ns, api_version=API, hook=HOOK, owner="converged-hpc", state="absent",
                  **backend.auth(READONLY_TOKEN))
    res = hook_task(params, check_mode=False)
    assert res.get("failed") is True and "HTTP 403" in res["msg"] and "machine-reader" in res["msg"], res
    assert HOOK in backend.api().get(API, "machines", ns, "cn-1")["metadata"]["annotations"]


def test_a_second_event_source_with_a_wrong_token_fails_after_a_first_one_ran(backend, admin_loaded):
    ns = backend.namespace()
    make_machine(backend.api(), ns, "cn-1")
    thread, out, res = run_source({"kubeconfig": admin_loaded, "namespaces": [ns], "window": 0.2},
                                  lambda ev: len(ev) >= 1)
    thread.join(30)
    assert reasons(out.events) == [(["initial"], ["cn-1"])], res
    thread, out, res = run_source(dict(backend.auth("not-the-admin-token"), namespaces=[ns]), lambda ev: False,
                                  timeout=10)
    thread.join(30)
    assert out.events == [] and "401" in str(res.get("error")), res
