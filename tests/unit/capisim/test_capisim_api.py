"""The simulator behaves like kube-apiserver for the kubernetes Python client and for plain HTTP.

Each test runs against both backends (conftest.backend): the simulator, and the real kube-apiserver
with $KUBEBUILDER_ASSETS; the same assertions hold on both, or the simulator is wrong. A test that
writes works in a namespace of its own (ns) holding the fixture's metal3 objects; what only the
simulator can show (the garbage collector of kube-controller-manager, a compaction on demand) is
marked so and runs on the simulator alone.
"""

import http.client
import json
import ssl
import threading
import time

import pytest
from kubernetes import client, dynamic, watch
from kubernetes.client.rest import ApiException

from conftest import ADMIN_TOKEN, READONLY_TOKEN, load_metal3

G, V = "cluster.x-k8s.io", "v1beta2"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slurm"


def api_client(backend, token=ADMIN_TOKEN):
    cfg = client.Configuration()
    cfg.host = backend.url
    if backend.ca_cert:
        cfg.ssl_ca_cert = backend.ca_cert
    if token:
        cfg.api_key = {"authorization": "Bearer " + token}
    return client.ApiClient(cfg)


@pytest.fixture
def co(backend):
    with api_client(backend) as api:
        yield client.CustomObjectsApi(api)


@pytest.fixture
def ns(backend):
    """A namespace of the test's own holding the fixture's metal3 objects."""
    return load_metal3(backend.api(), backend.namespace())


def raw(backend, path, token=ADMIN_TOKEN, method="GET", body=None, ctype=None):
    return backend.api(token or "").request(method, path, body, ctype or "application/json")


def names(listing):
    return [i["metadata"]["name"] for i in listing["items"]]


def machines_path(ns, name=None):
    return "/apis/cluster.x-k8s.io/v1beta2/namespaces/%s/machines%s" % (ns, "/" + name if name else "")


def test_dynamic_client_discovers_preferred_version(backend):
    with api_client(backend) as api:
        dyn = dynamic.DynamicClient(api)
        machines = dyn.resources.get(api_version="cluster.x-k8s.io/v1beta2", kind="Machine")
        assert machines.namespaced and machines.name == "machines" and "ma" in machines.short_names
        got = machines.get(namespace="metal3", name="hpc-compute-7d9f8-abcde")
        assert got.status.phase == "Provisioned"
        bmh = dyn.resources.get(api_version="metal3.io/v1alpha1", kind="BareMetalHost")
        assert len(bmh.get(namespace="metal3").items) == 8


def test_group_discovery_prefers_v1beta2(backend):
    status, body = raw(backend, "/apis/cluster.x-k8s.io")
    assert status == 200 and body["preferredVersion"]["version"] == "v1beta2"
    assert [v["version"] for v in body["versions"]] == ["v1beta2", "v1beta1"]


@pytest.mark.parametrize("selector,expected", [
    ("node-type=compute", 4),
    ("node-type in (compute,controller)", 6),
    ("!node-type", 1),
    ("node-type!=compute", 4),
    ("cluster.x-k8s.io/cluster-name=hpc,cluster.x-k8s.io/deployment-name=hpc-compute", 6),
])
def test_label_selectors(co, selector, expected):
    listing = co.list_namespaced_custom_object(G, V, "metal3", "machines", label_selector=selector)
    assert len(listing["items"]) == expected


def test_bad_label_selector_is_400(co):
    with pytest.raises(ApiException) as err:
        co.list_cluster_custom_object(G, V, "machines", label_selector="node-type in compute")
    assert err.value.status == 400
    assert json.loads(err.value.body)["message"] == "unable to parse requirement: found 'compute' expected: '('"


def test_field_selector_name_only(co):
    got = co.list_namespaced_custom_object(G, V, "metal3", "machines",
                                           field_selector="metadata.name=hpc-compute-7d9f8-abcde")
    assert names(got) == ["hpc-compute-7d9f8-abcde"]
    with pytest.raises(ApiException) as err:
        co.list_cluster_custom_object(G, V, "machines", field_selector="status.phase=Running")
    assert "field label not supported: status.phase" in err.value.body


def test_pagination_with_limit_and_continue(co):
    seen, token, remaining, rvs = [], None, [], set()
    limit = 2
    while True:
        page = co.list_namespaced_custom_object(G, V, "metal3", "machines", limit=limit, _continue=token)
        seen += names(page)
        rvs.add(page["metadata"]["resourceVersion"])
        token = page["metadata"].get("continue")
        if not token:
            assert "remainingItemCount" not in page["metadata"]
            break
        remaining.append(page["metadata"]["remainingItemCount"])
        limit = 3 if len(seen) >= 4 else 2  # the limit may change between pages
    assert len(seen) == 8 and len(set(seen)) == 8
    assert remaining == [6, 4, 1]
    assert len(rvs) == 1  # every page reports the first page's resourceVersion


def test_pages_are_a_snapshot(co, ns):
    name = "hpc-compute-7d9f8-abcde"
    co.patch_namespaced_custom_object(G, V, ns, "machines", name, {"metadata": {"finalizers": None}})
    page = co.list_namespaced_custom_object(G, V, ns, "machines", limit=5)
    co.delete_namespaced_custom_object(G, V, ns, "machines", name)
    assert name not in names(co.list_namespaced_custom_object(G, V, ns, "machines"))
    rest = co.list_namespaced_custom_object(G, V, ns, "machines", limit=50, _continue=page["metadata"]["continue"])
    assert len(page["items"]) + len(rest["items"]) == 8 and name in names(page) + names(rest)


@pytest.mark.parametrize("backend", ["sim"], indirect=True)  # a compaction on demand: the simulator's
def test_expired_continue_token_is_410_with_fresh_token(backend, co):
    page = co.list_cluster_custom_object(G, V, "machines", limit=2)
    status = raw(backend, "/_sim/compact", method="POST", body={})[0]
    assert status == 200
    with pytest.raises(ApiException) as err:
        co.list_cluster_custom_object(G, V, "machines", limit=2, _continue=page["metadata"]["continue"])
    assert err.value.status == 410
    body = json.loads(err.value.body)
    assert body["reason"] == "Expired" and body["metadata"]["continue"]


def test_resource_version_zero_ignores_limit(co):
    page = co.list_namespaced_custom_object(G, V, "metal3", "machines", limit=2, resource_version="0")
    assert len(page["items"]) == 8 and not page["metadata"].get("continue")


def test_merge_patch_adds_annotation_and_bumps_resource_version(co, ns):
    before = co.get_namespaced_custom_object(G, V, ns, "machines", "hpc-compute-7d9f8-abcde")
    after = co.patch_namespaced_custom_object(G, V, ns, "machines", "hpc-compute-7d9f8-abcde",
                                              {"metadata": {"annotations": {HOOK: "converged-hpc"}}})
    assert after["metadata"]["annotations"][HOOK] == "converged-hpc"
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    assert after["metadata"]["generation"] == before["metadata"]["generation"]  # metadata only


def test_merge_patch_with_stale_resource_version_is_409(backend):
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines/hpc-compute-7d9f8-abcde",
                       method="PATCH", ctype="application/merge-patch+json",
                       body={"metadata": {"resourceVersion": "3", "labels": {"x": "y"}}})
    assert status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]


def test_strategic_merge_patch_is_415(backend):
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines/hpc-compute-7d9f8-abcde",
                       method="PATCH", ctype="application/strategic-merge-patch+json", body={"metadata": {}})
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    assert "strategic" not in body["message"]


def test_a_built_in_kind_takes_a_strategic_merge_patch(backend):
    """As a real kube-apiserver: a Secret takes it (kubernetes.core's k8s tries it first); ObjectMeta's
    finalizers merge as a set and ownerReferences by uid (the patch's items first, in its order), other
    values as a merge patch; a map with the directive $patch: replace is replaced whole."""
    path = "/api/v1/namespaces/%s/secrets" % backend.namespace()
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "u-1"}
    meta = {"name": "smp", "finalizers": ["x/one"], "ownerReferences": [owner]}
    status, created = raw(backend, path, method="POST", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"a": "YQ==", "b": "Yg=="}, "type": "Opaque"})
    assert status == 201, created
    owners = [dict(owner, name="b"), dict(owner, uid="u-2")]
    status, got = raw(backend, path + "/smp", method="PATCH", ctype="application/strategic-merge-patch+json", body={
        "metadata": {"finalizers": ["x/two", "x/one"], "ownerReferences": owners}, "data": {"a": None, "c": "Yw=="}})
    assert status == 200, got
    assert got["data"] == {"b": "Yg==", "c": "Yw=="}
    assert got["metadata"]["finalizers"] == ["x/two", "x/one"]
    assert [(o["uid"], o["name"]) for o in got["metadata"]["ownerReferences"]] == [("u-1", "b"), ("u-2", "a")]
    assert int(got["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    status, got = raw(backend, path + "/smp", method="PATCH", ctype="application/strategic-merge-patch+json",
                      body={"data": {"$patch": "replace", "d": "ZA=="}})
    assert status == 200 and got["data"] == {"d": "ZA=="}, got
    # the finalizers go, or the Secret outlives the test's namespace
    raw(backend, path + "/smp", method="PATCH", ctype="application/merge-patch+json",
        body={"metadata": {"finalizers": None}})


def test_a_strategic_merge_directive_refused_changes_nothing(backend):
    # the real server refuses this $retainKeys (a key it does not keep); the simulator refuses every
    # directive but $patch, naming it
    path = "/api/v1/namespaces/%s/secrets" % backend.namespace()
    raw(backend, path, method="POST", body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "smp"},
                                            "data": {"b": "Yg=="}})
    status, body = raw(backend, path + "/smp", method="PATCH", ctype="application/strategic-merge-patch+json",
                       body={"data": {"$retainKeys": ["b"], "d": "ZA=="}})
    assert status == 400 and "retainKeys" in body["message"], body
    assert raw(backend, path + "/smp")[1]["data"] == {"b": "Yg=="}


@pytest.mark.parametrize("method,path,ctype,token", [
    ("PATCH", "/machines/hpc-compute-7d9f8-abcde", "application/strategic-merge-patch+json",
     ADMIN_TOKEN),                                                        # 415 before the body is needed
    ("PATCH", "/machines/nope", "application/merge-patch+json", ADMIN_TOKEN),   # 404
    ("DELETE", "/machines/nope", "application/json", ADMIN_TOKEN),              # 404, DeleteOptions
    ("PATCH", "/machines/hpc-compute-7d9f8-abcde", "application/merge-patch+json",
     "not-a-token"),                                                      # 401
])
def test_an_early_answer_still_reads_the_body_keep_alive_goes_on(backend, ns, method, path, ctype, token):
    # kubernetes.core retries a refused strategic merge patch as a merge patch on the same connection:
    # the body of the refused request must not be read as the next request (the real server answers both)
    where = backend.url.split("//", 1)[1]
    conn = http.client.HTTPSConnection(where, context=ssl.create_default_context(cafile=backend.ca_cert)) \
        if backend.ca_cert else http.client.HTTPConnection(where)
    base = "/apis/cluster.x-k8s.io/v1beta2/namespaces/" + ns
    body = json.dumps({"metadata": {"annotations": {HOOK: "x"}}, "propagationPolicy": "Background"})
    conn.request(method, base + path, body=body, headers={"Authorization": "Bearer " + token, "Content-Type": ctype})
    first = conn.getresponse()
    first.read()
    assert first.status in (401, 404, 415), first.status
    conn.request("PATCH", base + "/machines/hpc-compute-7d9f8-abcde", body=body,
                 headers={"Authorization": "Bearer " + ADMIN_TOKEN, "Content-Type": "application/merge-patch+json"})
    second = conn.getresponse()
    data = json.loads(second.read())
    assert second.status == 200 and data["metadata"]["annotations"][HOOK] == "x"
    conn.close()


def test_json_patch_remove_and_remove_missing(backend, ns):
    path = machines_path(ns, "hpc-compute-7d9f8-pqrst")
    op = [{"op": "remove", "path": "/metadata/annotations/" + HOOK.replace("/", "~1")}]
    status, body = raw(backend, path, method="PATCH", ctype="application/json-patch+json", body=op)
    assert status == 200 and HOOK not in body["metadata"].get("annotations", {})
    status, body = raw(backend, path, method="PATCH", ctype="application/json-patch+json", body=op)
    assert status == 422 and body["reason"] == "Invalid"


def test_json_patch_test_guards_the_change(backend, ns):
    # a failed "test" changes nothing: 422, with the message a real server gives (no cause named)
    path = machines_path(ns, "hpc-compute-7d9f8-abcde")
    ops = [{"op": "test", "path": "/metadata/labels/node-type", "value": "gpu"},
           {"op": "add", "path": "/metadata/annotations", "value": {"x": "y"}}]
    status, body = raw(backend, path, method="PATCH", ctype="application/json-patch+json", body=ops)
    assert (status, body["reason"], body["message"], body["details"]) == \
        (422, "Invalid", "the server rejected our request due to an error in our request", {})
    assert "x" not in (raw(backend, path)[1]["metadata"].get("annotations") or {})
    ops[0]["value"] = "compute"
    status, body = raw(backend, path, method="PATCH", ctype="application/json-patch+json", body=ops)
    assert status == 200 and body["metadata"]["annotations"] == {"x": "y"}


def test_removing_the_last_annotation_drops_the_map(backend, co, ns):
    co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("bare"))
    path = machines_path(ns, "bare")
    status, body = raw(backend, path, method="PATCH", ctype="application/merge-patch+json",
                       body={"metadata": {"annotations": {"only": "one"}}})
    assert status == 200 and body["metadata"]["annotations"] == {"only": "one"}
    status, body = raw(backend, path, method="PATCH", ctype="application/merge-patch+json",
                       body={"metadata": {"annotations": {"only": None}}})
    assert status == 200 and "annotations" not in body["metadata"], body["metadata"]


def test_status_is_a_subresource(co, ns):
    name = "hpc-compute-7d9f8-abcde"
    co.patch_namespaced_custom_object(G, V, ns, "machines", name, {"status": {"phase": "Failed"}})
    assert co.get_namespaced_custom_object(G, V, ns, "machines", name)["status"]["phase"] == "Provisioned"
    co.patch_namespaced_custom_object_status(G, V, ns, "machines", name, {"status": {"phase": "Failed"}})
    assert co.get_namespaced_custom_object(G, V, ns, "machines", name)["status"]["phase"] == "Failed"


def test_put_with_stale_resource_version_is_409(co, ns):
    obj = co.get_namespaced_custom_object(G, V, ns, "machines", "hpc-compute-7d9f8-fghij")
    co.patch_namespaced_custom_object(G, V, ns, "machines", "hpc-compute-7d9f8-fghij",
                                      {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as err:
        co.replace_namespaced_custom_object(G, V, ns, "machines", "hpc-compute-7d9f8-fghij", obj)
    assert err.value.status == 409


def machine_body(name, finalizers=(), annotations=None):
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "finalizers": list(finalizers), "annotations": annotations or {},
                         "labels": {"cluster.x-k8s.io/cluster-name": "hpc", "node-type": "compute"}},
            "spec": {"clusterName": "hpc", "bootstrap": {"dataSecretName": "x"},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "Metal3Machine", "name": name}}}


def test_create_conflict_and_invalid(co, ns):
    created = co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("fresh-1"))
    assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("fresh-1"))
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
    bad = machine_body("fresh-2")
    bad["metadata"]["labels"]["node-type"] = "gpu compute"
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, ns, "machines", bad)
    assert err.value.status == 422
    wrong = machine_body("fresh-3")
    wrong["kind"] = "Metal3Machine"
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, ns, "machines", wrong)
    assert "must be Machine" in json.loads(err.value.body)["message"]


def test_delete_with_finalizer_waits_for_the_finalizer(co, ns):
    co.create_namespaced_custom_object(G, V, ns, "machines",
                                       machine_body("fin01", ["machine.cluster.x-k8s.io"], {HOOK: "converged-hpc"}))
    first = co.delete_namespaced_custom_object(G, V, ns, "machines", "fin01")
    assert first["kind"] == "Machine" and first["metadata"]["deletionTimestamp"]
    assert first["metadata"]["deletionGracePeriodSeconds"] == 0 and first["metadata"]["generation"] == 2
    again = co.delete_namespaced_custom_object(G, V, ns, "machines", "fin01")
    assert again["metadata"]["deletionTimestamp"] == first["metadata"]["deletionTimestamp"]
    co.patch_namespaced_custom_object(G, V, ns, "machines", "fin01", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(G, V, ns, "machines", "fin01")
    assert err.value.status == 404


def test_delete_without_finalizer_returns_status(co, ns):
    co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("plain"))
    gone = co.delete_namespaced_custom_object(G, V, ns, "machines", "plain")
    assert gone["kind"] == "Status" and gone["status"] == "Success" and gone["details"]["uid"]


def test_dry_run_answers_and_stores_nothing(backend, co, ns):
    path = machines_path(ns)
    status, body = raw(backend, path + "?dryRun=All", method="POST", body=machine_body("dry-1"),
                       ctype="application/json")
    # answered as a create, never stored: no resourceVersion (etcd never saw it)
    assert status == 201 and body["metadata"]["uid"] and "resourceVersion" not in body["metadata"]
    assert raw(backend, path + "/dry-1")[0] == 404
    co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("dry-2"))
    before = co.get_namespaced_custom_object(G, V, ns, "machines", "dry-2")
    status, body = raw(backend, path + "/dry-2?dryRun=All", method="PATCH",
                       body={"metadata": {"annotations": {HOOK: "x"}}}, ctype="application/merge-patch+json")
    assert status == 200 and body["metadata"]["annotations"][HOOK] == "x"
    assert body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    status, body = raw(backend, path + "/dry-2?dryRun=All", method="DELETE")
    assert status == 200 and body["status"] == "Success"
    assert co.get_namespaced_custom_object(G, V, ns, "machines", "dry-2") == before
    status, body = raw(backend, path + "/dry-2?dryRun=true", method="DELETE")
    assert status == 422 and body["message"] == ('DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported '
                                                 'value: ["true"]: supported values: "All"')


def test_delete_options_preconditions(backend, co, ns):
    path = machines_path(ns)
    uid = co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("opt-1"))["metadata"]["uid"]
    status, body = raw(backend, path + "/opt-1", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-" + uid}})
    assert status == 409 and body["reason"] == "Conflict"
    assert body["message"] == ('Operation cannot be fulfilled on Machine.cluster.x-k8s.io "opt-1": the UID in the '
                               'precondition (not-%s) does not match the UID in record (%s). The object might have '
                               'been deleted and then recreated' % (uid, uid))
    # Foreground: the garbage collector's finalizer (which only its controller removes)
    status, body = raw(backend, path + "/opt-1", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "propagationPolicy": "Foreground", "preconditions": {"uid": uid}})
    assert status == 200 and body["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert body["metadata"]["deletionTimestamp"]
    # orphanDependents: false on an object a finalizer holds: 202 Accepted
    co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("opt-2", ["machine.cluster.x-k8s.io"]))
    status, body = raw(backend, path + "/opt-2", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "orphanDependents": False})
    assert status == 202 and body["metadata"]["deletionTimestamp"]


@pytest.mark.parametrize("backend", ["sim"], indirect=True)  # the garbage collector: kube-controller-manager's
def test_the_garbage_collector_ends_a_foreground_deletion(backend, co):
    path = machines_path("metal3")
    co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("opt-1"))
    status, body = raw(backend, path + "/opt-1", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "propagationPolicy": "Foreground"})
    assert status == 200 and body["metadata"]["finalizers"] == ["foregroundDeletion"]
    deadline = time.time() + 5
    while raw(backend, path + "/opt-1")[0] != 404:
        assert time.time() < deadline, "the foregroundDeletion finalizer never went"
        time.sleep(0.05)


@pytest.mark.parametrize("backend", ["sim"], indirect=True)  # the garbage collector: kube-controller-manager's
def test_foreground_deletes_dependents_first_orphan_keeps_them(backend, co):
    owner = co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("own-1"))
    ref = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine", "name": "own-1",
           "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True}
    for name in ("dep-1", "dep-2"):
        body = machine_body(name)
        body["metadata"]["ownerReferences"] = [ref]
        co.create_namespaced_custom_object(G, V, "metal3", "machines", body)
    co.delete_namespaced_custom_object(G, V, "metal3", "machines", "own-1", propagation_policy="Orphan")
    deadline = time.time() + 5
    while "own-1" in names(co.list_namespaced_custom_object(G, V, "metal3", "machines")):
        assert time.time() < deadline
        time.sleep(0.05)
    kept = co.get_namespaced_custom_object(G, V, "metal3", "machines", "dep-1")
    assert not kept["metadata"].get("ownerReferences")  # orphaned, not deleted
    owner = co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("own-2"))
    body = machine_body("dep-3")
    body["metadata"]["ownerReferences"] = [dict(ref, name="own-2", uid=owner["metadata"]["uid"])]
    co.create_namespaced_custom_object(G, V, "metal3", "machines", body)
    co.delete_namespaced_custom_object(G, V, "metal3", "machines", "own-2", propagation_policy="Foreground")
    deadline = time.time() + 5
    while {"own-2", "dep-3"} & set(names(co.list_namespaced_custom_object(G, V, "metal3", "machines"))):
        assert time.time() < deadline
        time.sleep(0.05)


def test_no_new_finalizer_on_a_deleting_object_is_422(co, ns):
    co.create_namespaced_custom_object(G, V, ns, "machines", machine_body("fin-del", ["machine.cluster.x-k8s.io"]))
    co.delete_namespaced_custom_object(G, V, ns, "machines", "fin-del")
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object(G, V, ns, "machines", "fin-del",
                                          {"metadata": {"finalizers": ["machine.cluster.x-k8s.io", "extra/one"]}})
    status = json.loads(err.value.body)
    assert err.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"] == ('Machine.cluster.x-k8s.io "fin-del" is invalid: metadata.finalizers: Forbidden: '
                                 'no new finalizers can be added if the object is being deleted, found new '
                                 'finalizers []string{"extra/one"}')
    # removing one is allowed, and the last one going deletes it
    co.patch_namespaced_custom_object(G, V, ns, "machines", "fin-del", {"metadata": {"finalizers": []}})
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(G, V, ns, "machines", "fin-del")
    assert err.value.status == 404


def test_writes_record_their_field_manager(backend, ns):
    path = machines_path(ns, "hpc-compute-7d9f8-abcde")

    def patch(body, query=None, agent="kubectl/v1.36.0 (linux/amd64)", sub=""):
        status, got = backend.api().request("PATCH", path + sub, body, "application/merge-patch+json", query=query,
                                            headers={"User-Agent": agent})
        assert status == 200, got
        return got

    before = raw(backend, path)[1]
    managers = [(e["manager"], e.get("subresource")) for e in before["metadata"]["managedFields"]]
    assert managers == [("capi-controller-manager", None), ("capi-controller-manager", "status")]

    def entry(obj, manager):
        (out,) = [e for e in obj["metadata"]["managedFields"] if e["manager"] == manager]
        return out

    after = patch({"metadata": {"annotations": {HOOK: "converged-hpc"}}})
    mine = entry(after, "kubectl")
    assert mine["manager"] == "kubectl" and mine["operation"] == "Update" and "subresource" not in mine
    assert mine["fieldsV1"] == {"f:metadata": {"f:annotations": {"f:" + HOOK: {}}}}
    # the same write again changes nothing: same resourceVersion, same managedFields
    again = patch({"metadata": {"annotations": {HOOK: "converged-hpc"}}})
    assert again["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
    assert again["metadata"]["managedFields"] == after["metadata"]["managedFields"]
    # fieldManager names the manager; a status write is an entry of its own
    status = entry(patch({"status": {"phase": "Running"}}, {"fieldManager": "converged-hpc"}, sub="/status"),
                   "converged-hpc")
    assert status["subresource"] == "status" and status["fieldsV1"] == {"f:status": {"f:phase": {}}}


def test_v1beta1_read_prunes_apigroup_and_warns(backend):
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1beta1/namespaces/metal3/machines/hpc-compute-7d9f8-abcde")
    assert status == 200 and body["apiVersion"] == "cluster.x-k8s.io/v1beta1"
    assert "apiGroup" not in body["spec"]["infrastructureRef"] and "deletion" not in body["spec"]


def test_auth_no_token_403_bad_token_401_readonly_scoped(backend):
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1beta2/machines", token=None)
    assert status == 403 and 'User "system:anonymous" cannot list resource "machines"' in body["message"]
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1beta2/machines", token="nope")
    assert status == 401 and body["reason"] == "Unauthorized"
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines", token=READONLY_TOKEN)
    assert status == 200 and len(body["items"]) == 8
    status, body = raw(backend, "/apis/metal3.io/v1alpha1/baremetalhosts", token=READONLY_TOKEN)
    assert status == 403 and 'User "machine-reader"' in body["message"]


def test_scale_subresource(backend, ns):
    """What Cluster API's autoscaler, KEDA and converged.hpc.machine_scale send: a merge patch or a JSON
    patch of the Scale; a strategic merge patch is refused (a custom resource's), a failed test changes
    nothing, a stale resourceVersion is a conflict."""
    path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/%s/machinedeployments/hpc-compute/scale" % ns
    status, body = raw(backend, path)
    assert status == 200 and (body["kind"], body["apiVersion"]) == ("Scale", "autoscaling/v1")
    assert body["spec"]["replicas"] == 5 and body["metadata"]["name"] == "hpc-compute"
    status, body = raw(backend, path, method="PATCH", ctype="application/strategic-merge-patch+json",
                       body={"spec": {"replicas": 6}})
    assert status == 415 and body["reason"] == "UnsupportedMediaType", body
    assert "strategic" not in body["message"]
    status, body = raw(backend, path, method="PATCH", ctype="application/merge-patch+json",
                       body={"spec": {"replicas": 7}})
    assert status == 200 and body["spec"]["replicas"] == 7
    test_and_set = [{"op": "test", "path": "/spec/replicas", "value": 5},
                    {"op": "replace", "path": "/spec/replicas", "value": 6}]
    status, body = raw(backend, path, method="PATCH", ctype="application/json-patch+json", body=test_and_set)
    assert status == 422 and body["reason"] == "Invalid", body
    test_and_set[0]["value"] = 7
    status, body = raw(backend, path, method="PATCH", ctype="application/json-patch+json", body=test_and_set)
    assert status == 200 and body["spec"]["replicas"] == 6
    status, body = raw(backend, path, method="PATCH", ctype="application/merge-patch+json",
                       body={"metadata": {"resourceVersion": "3"}, "spec": {"replicas": 1}})
    assert status == 409 and body["reason"] == "Conflict", body
    md = raw(backend, path.rsplit("/", 1)[0])[1]
    assert md["spec"]["replicas"] == 6 and md["metadata"]["resourceVersion"] == body_rv(raw(backend, path)[1])
    status, body = raw(backend, path, method="PATCH", ctype="application/merge-patch+json",
                       body={"spec": {"replicas": -1}})
    assert status == 422 and body["reason"] == "Invalid", body


def body_rv(obj):
    return obj["metadata"]["resourceVersion"]


def test_watch_streams_changes_with_selector_semantics(co, ns):
    start_rv = co.list_namespaced_custom_object(G, V, ns, "machines")["metadata"]["resourceVersion"]
    events = []

    def collect():
        w = watch.Watch()
        for ev in w.stream(co.list_namespaced_custom_object, G, V, ns, "machines", resource_version=start_rv,
                           label_selector="slurm.example.org/state=drain", timeout_seconds=3):
            events.append((ev["type"], ev["object"]["metadata"]["name"]))

    t = threading.Thread(target=collect)
    t.start()
    time.sleep(0.5)
    name = "hpc-compute-7d9f8-abcde"
    co.patch_namespaced_custom_object(G, V, ns, "machines", name,
                                      {"metadata": {"labels": {"slurm.example.org/state": "drain"}}})
    co.patch_namespaced_custom_object(G, V, ns, "machines", name,
                                      {"metadata": {"labels": {"slurm.example.org/state": None}}})
    t.join(10)
    assert events == [("ADDED", name), ("DELETED", name)]


def test_watch_from_too_old_resource_version_is_410(co):
    w = watch.Watch()
    with pytest.raises(ApiException) as err:
        for dummy in w.stream(co.list_cluster_custom_object, G, V, "machines", resource_version="1",
                              timeout_seconds=2):
            pass
    assert err.value.status == 410


def test_unknown_version_is_plain_text_404(backend):
    status, body = raw(backend, "/apis/cluster.x-k8s.io/v1alpha4/namespaces/metal3/machines")
    assert status == 404 and body == "404 page not found\n"
