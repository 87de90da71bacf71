"""The simulator behaves like kube-apiserver for the kubernetes Python client."""

import http.client
import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client, dynamic, watch
from kubernetes.client.rest import ApiException

from conftest import ADMIN_TOKEN, READONLY_TOKEN

G, V = "cluster.x-k8s.io", "v1beta2"
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/slurm"


def api_client(sim, token=ADMIN_TOKEN):
    cfg = client.Configuration()
    cfg.host = sim.url
    if token:
        cfg.api_key = {"authorization": "Bearer " + token}
    return client.ApiClient(cfg)


@pytest.fixture
def co(sim):
    with api_client(sim) as api:
        yield client.CustomObjectsApi(api)


def raw(sim, path, token=ADMIN_TOKEN, method="GET", body=None, ctype=None):
    headers = {"Authorization": "Bearer " + token} if token else {}
    if ctype:
        headers["Content-Type"] = ctype
    req = urllib.request.Request(sim.url + path, method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        data = err.read()
        try:
            return err.code, json.loads(data)
        except ValueError:
            return err.code, data.decode()


def names(listing):
    return [i["metadata"]["name"] for i in listing["items"]]


def test_dynamic_client_discovers_preferred_version(sim):
    with api_client(sim) as api:
        dyn = dynamic.DynamicClient(api)
        machines = dyn.resources.get(api_version="cluster.x-k8s.io/v1beta2", kind="Machine")
        assert machines.namespaced and machines.name == "machines" and "ma" in machines.short_names
        got = machines.get(namespace="metal3", name="hpc-compute-7d9f8-abcde")
        assert got.status.phase == "Provisioned"
        bmh = dyn.resources.get(api_version="metal3.io/v1alpha1", kind="BareMetalHost")
        assert len(bmh.get().items) == 10


def test_group_discovery_prefers_v1beta2(sim):
    status, body = raw(sim, "/apis/cluster.x-k8s.io")
    assert status == 200 and body["preferredVersion"]["version"] == "v1beta2"
    assert [v["version"] for v in body["versions"]] == ["v1beta2", "v1beta1"]


@pytest.mark.parametrize("selector,expected", [
    ("node-type=compute", 6),
    ("node-type in (compute,controller)", 8),
    ("!node-type", 1),
    ("node-type!=compute", 4),
    ("cluster.x-k8s.io/cluster-name=hpc,cluster.x-k8s.io/deployment-name=hpc-compute", 6),
])
def test_label_selectors(co, selector, expected):
    listing = co.list_cluster_custom_object(G, V, "machines", label_selector=selector)
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
        page = co.list_cluster_custom_object(G, V, "machines", limit=limit, _continue=token)
        seen += names(page)
        rvs.add(page["metadata"]["resourceVersion"])
        token = page["metadata"].get("continue")
        if not token:
            assert "remainingItemCount" not in page["metadata"]
            break
        remaining.append(page["metadata"]["remainingItemCount"])
        limit = 4 if len(seen) >= 4 else 2  # the limit may change between pages
    assert len(seen) == 10 and len(set(seen)) == 10
    assert remaining == [8, 6, 2]
    assert len(rvs) == 1  # every page reports the first page's resourceVersion


def test_pages_are_a_snapshot(co):
    page = co.list_cluster_custom_object(G, V, "machines", limit=5)
    co.delete_namespaced_custom_object(G, V, "lab2", "machines", "edge-workers-6f5d4-r8t3k")
    rest = co.list_cluster_custom_object(G, V, "machines", limit=50, _continue=page["metadata"]["continue"])
    assert len(page["items"]) + len(rest["items"]) == 10


def test_expired_continue_token_is_410_with_fresh_token(sim, co):
    page = co.list_cluster_custom_object(G, V, "machines", limit=2)
    status = raw(sim, "/_sim/compact", method="POST", body={})[0]
    assert status == 200
    with pytest.raises(ApiException) as err:
        co.list_cluster_custom_object(G, V, "machines", limit=2, _continue=page["metadata"]["continue"])
    assert err.value.status == 410
    body = json.loads(err.value.body)
    assert body["reason"] == "Expired" and body["metadata"]["continue"]


def test_resource_version_zero_ignores_limit(co):
    page = co.list_cluster_custom_object(G, V, "machines", limit=2, resource_version="0")
    assert len(page["items"]) == 10 and not page["metadata"].get("continue")


def test_merge_patch_adds_annotation_and_bumps_resource_version(co):
    before = co.get_namespaced_custom_object(G, V, "metal3", "machines", "hpc-compute-7d9f8-abcde")
    after = co.patch_namespaced_custom_object(G, V, "metal3", "machines", "hpc-compute-7d9f8-abcde",
                                              {"metadata": {"annotations": {HOOK: "converged-hpc"}}})
    assert after["metadata"]["annotations"][HOOK] == "converged-hpc"
    assert int(after["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    assert after["metadata"]["generation"] == before["metadata"]["generation"]  # metadata only


def test_merge_patch_with_stale_resource_version_is_409(sim):
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines/hpc-compute-7d9f8-abcde",
                       method="PATCH", ctype="application/merge-patch+json",
                       body={"metadata": {"resourceVersion": "3", "labels": {"x": "y"}}})
    assert status == 409 and body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]


def test_strategic_merge_patch_is_415(sim):
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines/hpc-compute-7d9f8-abcde",
                       method="PATCH", ctype="application/strategic-merge-patch+json", body={"metadata": {}})
    assert status == 415 and body["reason"] == "UnsupportedMediaType"
    assert "strategic" not in body["message"]


def test_a_built_in_kind_takes_a_strategic_merge_patch(sim):
    """As a real kube-apiserver: a Secret takes it (kubernetes.core's k8s tries it first); ObjectMeta's
    finalizers merge as a set and ownerReferences by uid, other values as a merge patch."""
    path = "/api/v1/namespaces/metal3/secrets"
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": "u-1"}
    meta = {"name": "smp", "finalizers": ["x/one"], "ownerReferences": [owner]}
    status, created = raw(sim, path, method="POST", body={
        "apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {"a": "YQ==", "b": "Yg=="}, "type": "Opaque"})
    assert status == 201, created
    owners = [dict(owner, name="b"), dict(owner, uid="u-2")]
    status, got = raw(sim, path + "/smp", method="PATCH", ctype="application/strategic-merge-patch+json", body={
        "metadata": {"finalizers": ["x/two", "x/one"], "ownerReferences": owners}, "data": {"a": None, "c": "Yw=="}})
    assert status == 200, got
    assert got["data"] == {"b": "Yg==", "c": "Yw=="}
    assert got["metadata"]["finalizers"] == ["x/one", "x/two"]
    assert [(o["uid"], o["name"]) for o in got["metadata"]["ownerReferences"]] == [("u-1", "b"), ("u-2", "a")]
    assert int(got["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    # a directive it does not apply is refused, naming it, and changes nothing
    status, body = raw(sim, path + "/smp", method="PATCH", ctype="application/strategic-merge-patch+json",
                       body={"data": {"$patch": "replace", "d": "ZA=="}})
    assert status == 400 and "$patch" in body["message"], body
    assert raw(sim, path + "/smp")[1]["data"] == {"b": "Yg==", "c": "Yw=="}


@pytest.mark.parametrize("method,path,ctype,token", [
    ("PATCH", "/namespaces/metal3/machines/hpc-compute-7d9f8-abcde", "application/strategic-merge-patch+json",
     ADMIN_TOKEN),                                                        # 415 before the body is needed
    ("PATCH", "/namespaces/metal3/machines/nope", "application/merge-patch+json", ADMIN_TOKEN),   # 404
    ("DELETE", "/namespaces/metal3/machines/nope", "application/json", ADMIN_TOKEN),              # 404, DeleteOptions
    ("PATCH", "/namespaces/metal3/machines/hpc-compute-7d9f8-abcde", "application/merge-patch+json",
     "not-a-token"),                                                      # 401
])
def test_an_early_answer_still_reads_the_body_keep_alive_goes_on(sim, method, path, ctype, token):
    # kubernetes.core retries a refused strategic merge patch as a merge patch on the same connection:
    # the body of the refused request must not be read as the next request (the real server answers both)
    conn = http.client.HTTPConnection(sim.url.split("//", 1)[1])
    base = "/apis/cluster.x-k8s.io/v1beta2"
    body = json.dumps({"metadata": {"annotations": {HOOK: "x"}}, "propagationPolicy": "Background"})
    conn.request(method, base + path, body=body, headers={"Authorization": "Bearer " + token, "Content-Type": ctype})
    first = conn.getresponse()
    first.read()
    assert first.status in (401, 404, 415), first.status
    conn.request("PATCH", base + "/namespaces/metal3/machines/hpc-compute-7d9f8-abcde", body=body,
                 headers={"Authorization": "Bearer " + ADMIN_TOKEN, "Content-Type": "application/merge-patch+json"})
    second = conn.getresponse()
    data = json.loads(second.read())
    assert second.status == 200 and data["metadata"]["annotations"][HOOK] == "x"
    conn.close()


def test_json_patch_remove_and_remove_missing(sim):
    path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines/hpc-compute-7d9f8-pqrst"
    op = [{"op": "remove", "path": "/metadata/annotations/" + HOOK.replace("/", "~1")}]
    status, body = raw(sim, path, method="PATCH", ctype="application/json-patch+json", body=op)
    assert status == 200 and HOOK not in body["metadata"].get("annotations", {})
    status, body = raw(sim, path, method="PATCH", ctype="application/json-patch+json", body=op)
    assert status == 422 and body["reason"] == "Invalid"


def test_status_is_a_subresource(co):
    name = "hpc-compute-7d9f8-abcde"
    co.patch_namespaced_custom_object(G, V, "metal3", "machines", name, {"status": {"phase": "Failed"}})
    assert co.get_namespaced_custom_object(G, V, "metal3", "machines", name)["status"]["phase"] == "Provisioned"
    co.patch_namespaced_custom_object_status(G, V, "metal3", "machines", name, {"status": {"phase": "Failed"}})
    assert co.get_namespaced_custom_object(G, V, "metal3", "machines", name)["status"]["phase"] == "Failed"


def test_put_with_stale_resource_version_is_409(co):
    obj = co.get_namespaced_custom_object(G, V, "metal3", "machines", "hpc-compute-7d9f8-fghij")
    co.patch_namespaced_custom_object(G, V, "metal3", "machines", "hpc-compute-7d9f8-fghij",
                                      {"metadata": {"labels": {"touched": "yes"}}})
    with pytest.raises(ApiException) as err:
        co.replace_namespaced_custom_object(G, V, "metal3", "machines", "hpc-compute-7d9f8-fghij", obj)
    assert err.value.status == 409


def machine_body(name, finalizers=(), annotations=None):
    return {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": name, "finalizers": list(finalizers), "annotations": annotations or {},
                         "labels": {"cluster.x-k8s.io/cluster-name": "hpc", "node-type": "compute"}},
            "spec": {"clusterName": "hpc", "bootstrap": {"dataSecretName": "x"},
                     "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io",
                                           "kind": "Metal3Machine", "name": name}}}


def test_create_conflict_and_invalid(co):
    created = co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("fresh-1"))
    assert created["metadata"]["uid"] and created["metadata"]["generation"] == 1
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("fresh-1"))
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
    bad = machine_body("fresh-2")
    bad["metadata"]["labels"]["node-type"] = "gpu compute"
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, "metal3", "machines", bad)
    assert err.value.status == 422
    wrong = machine_body("fresh-3")
    wrong["kind"] = "Metal3Machine"
    with pytest.raises(ApiException) as err:
        co.create_namespaced_custom_object(G, V, "metal3", "machines", wrong)
    assert "must be Machine" in json.loads(err.value.body)["message"]


def test_delete_with_finalizer_waits_for_the_finalizer(co):
    co.create_namespaced_custom_object(G, V, "metal3", "machines",
                                       machine_body("fin01", ["machine.cluster.x-k8s.io"], {HOOK: "converged-hpc"}))
    first = co.delete_namespaced_custom_object(G, V, "metal3", "machines", "fin01")
    assert first["kind"] == "Machine" and first["metadata"]["deletionTimestamp"]
    assert first["metadata"]["deletionGracePeriodSeconds"] == 0 and first["metadata"]["generation"] == 2
    again = co.delete_namespaced_custom_object(G, V, "metal3", "machines", "fin01")
    assert again["metadata"]["deletionTimestamp"] == first["metadata"]["deletionTimestamp"]
    co.patch_namespaced_custom_object(G, V, "metal3", "machines", "fin01", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(G, V, "metal3", "machines", "fin01")
    assert err.value.status == 404


def test_delete_without_finalizer_returns_status(co):
    co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("plain"))
    gone = co.delete_namespaced_custom_object(G, V, "metal3", "machines", "plain")
    assert gone["kind"] == "Status" and gone["status"] == "Success" and gone["details"]["uid"]


def test_dry_run_answers_and_stores_nothing(sim, co):
    path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines"
    status, body = raw(sim, path + "?dryRun=All", method="POST", body=machine_body("dry-1"),
                       ctype="application/json")
    # answered as a create, never stored: no resourceVersion (etcd never saw it)
    assert status == 201 and body["metadata"]["uid"] and "resourceVersion" not in body["metadata"]
    assert raw(sim, path + "/dry-1")[0] == 404
    co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("dry-2"))
    before = co.get_namespaced_custom_object(G, V, "metal3", "machines", "dry-2")
    status, body = raw(sim, path + "/dry-2?dryRun=All", method="PATCH",
                       body={"metadata": {"annotations": {HOOK: "x"}}}, ctype="application/merge-patch+json")
    assert status == 200 and body["metadata"]["annotations"][HOOK] == "x"
    assert body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    status, body = raw(sim, path + "/dry-2?dryRun=All", method="DELETE")
    assert status == 200 and body["status"] == "Success"
    assert co.get_namespaced_custom_object(G, V, "metal3", "machines", "dry-2") == before
    status, body = raw(sim, path + "/dry-2?dryRun=true", method="DELETE")
    assert status == 422 and body["message"] == ('DeleteOptions.meta.k8s.io "" is invalid: dryRun: Unsupported '
                                                 'value: []string{"true"}: supported values: "All"')


def test_delete_options_preconditions_and_propagation(sim, co):
    path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines"
    uid = co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("opt-1"))["metadata"]["uid"]
    status, body = raw(sim, path + "/opt-1", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-" + uid}})
    assert status == 409 and body["reason"] == "Conflict"
    assert body["message"] == ('Operation cannot be fulfilled on machines.cluster.x-k8s.io "opt-1": Precondition '
                               'failed: UID in precondition: not-%s, UID in object meta: %s' % (uid, uid))
    # Foreground: the garbage collector's finalizer, then (no dependents) the object goes
    status, body = raw(sim, path + "/opt-1", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "propagationPolicy": "Foreground", "preconditions": {"uid": uid}})
    assert status == 200 and body["metadata"]["finalizers"] == ["foregroundDeletion"]
    assert body["metadata"]["deletionTimestamp"]
    deadline = time.time() + 5
    while raw(sim, path + "/opt-1")[0] != 404:
        assert time.time() < deadline, "the foregroundDeletion finalizer never went"
        time.sleep(0.05)
    # orphanDependents: false on an object a finalizer holds: 202 Accepted
    co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("opt-2", ["machine.cluster.x-k8s.io"]))
    status, body = raw(sim, path + "/opt-2", method="DELETE", ctype="application/json",
                       body={"kind": "DeleteOptions", "orphanDependents": False})
    assert status == 202 and body["metadata"]["deletionTimestamp"]


def test_foreground_deletes_dependents_first_orphan_keeps_them(sim, co):
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


def test_no_new_finalizer_on_a_deleting_object_is_422(co):
    co.create_namespaced_custom_object(G, V, "metal3", "machines", machine_body("fin-del", ["machine.cluster.x-k8s.io"]))
    co.delete_namespaced_custom_object(G, V, "metal3", "machines", "fin-del")
    with pytest.raises(ApiException) as err:
        co.patch_namespaced_custom_object(G, V, "metal3", "machines", "fin-del",
                                          {"metadata": {"finalizers": ["machine.cluster.x-k8s.io", "extra/one"]}})
    status = json.loads(err.value.body)
    assert err.value.status == 422 and status["reason"] == "Invalid"
    assert status["message"] == ('Machine.cluster.x-k8s.io "fin-del" is invalid: metadata.finalizers: Forbidden: '
                                 'no new finalizers can be added if the object is being deleted, found new '
                                 'finalizers []string{"extra/one"}')
    # removing one is allowed, and the last one going deletes it
    co.patch_namespaced_custom_object(G, V, "metal3", "machines", "fin-del", {"metadata": {"finalizers": []}})
    with pytest.raises(ApiException) as err:
        co.get_namespaced_custom_object(G, V, "metal3", "machines", "fin-del")
    assert err.value.status == 404


def test_writes_record_their_field_manager(sim):
    path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machines/hpc-compute-7d9f8-abcde"

    def patch(body, query="", agent="kubectl/v1.36.0 (linux/amd64)", sub=""):
        req = urllib.request.Request(sim.url + path + sub + query, method="PATCH", data=json.dumps(body).encode(),
                                     headers={"Authorization": "Bearer " + ADMIN_TOKEN, "User-Agent": agent,
                                              "Content-Type": "application/merge-patch+json"})
        with urllib.request.urlopen(req) as resp:
            return json.loads(resp.read())

    before = raw(sim, path)[1]
    managers = [(e["manager"], e.get("subresource")) for e in before["metadata"]["managedFields"]]
    assert managers == [("capi-controller-manager", None), ("capi-controller-manager", "status")]
    after = patch({"metadata": {"annotations": {HOOK: "converged-hpc"}}})
    mine = after["metadata"]["managedFields"][-1]
    assert mine["manager"] == "kubectl" and mine["operation"] == "Update" and "subresource" not in mine
    assert mine["fieldsV1"] == {"f:metadata": {"f:annotations": {"f:" + HOOK: {}}}}
    # the same write again changes nothing: same resourceVersion, same managedFields
    again = patch({"metadata": {"annotations": {HOOK: "converged-hpc"}}})
    assert again["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]
    assert again["metadata"]["managedFields"] == after["metadata"]["managedFields"]
    # fieldManager names the manager; a status write is an entry of its own
    status = patch({"status": {"phase": "Running"}}, "?fieldManager=converged-hpc", sub="/status")
    entry = status["metadata"]["managedFields"][-1]
    assert (entry["manager"], entry["subresource"]) == ("converged-hpc", "status")
    assert entry["fieldsV1"] == {"f:status": {"f:phase": {}}}


def test_v1beta1_read_prunes_apigroup_and_warns(sim):
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1beta1/namespaces/metal3/machines/hpc-compute-7d9f8-abcde")
    assert status == 200 and body["apiVersion"] == "cluster.x-k8s.io/v1beta1"
    assert "apiGroup" not in body["spec"]["infrastructureRef"] and "deletion" not in body["spec"]


def test_auth_no_token_403_bad_token_401_readonly_scoped(sim):
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1beta2/machines", token=None)
    assert status == 403 and 'User "system:anonymous" cannot list resource "machines"' in body["message"]
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1beta2/machines", token="nope")
    assert status == 401 and body["reason"] == "Unauthorized"
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1beta2/machines", token=READONLY_TOKEN)
    assert status == 200 and len(body["items"]) == 10
    status, body = raw(sim, "/apis/metal3.io/v1alpha1/baremetalhosts", token=READONLY_TOKEN)
    assert status == 403 and 'User "machine-reader"' in body["message"]


def test_scale_subresource(sim):
    path = "/apis/cluster.x-k8s.io/v1beta2/namespaces/metal3/machinedeployments/hpc-compute/scale"
    status, body = raw(sim, path)
    assert status == 200 and body["kind"] == "Scale" and body["spec"]["replicas"] == 5
    status, body = raw(sim, path, method="PATCH", ctype="application/merge-patch+json",
                       body={"spec": {"replicas": 7}})
    assert status == 200 and body["spec"]["replicas"] == 7


def test_watch_streams_changes_with_selector_semantics(sim, co):
    start_rv = co.list_cluster_custom_object(G, V, "machines")["metadata"]["resourceVersion"]
    events = []

    def collect():
        w = watch.Watch()
        for ev in w.stream(co.list_cluster_custom_object, G, V, "machines", resource_version=start_rv,
                           label_selector="slurm.example.org/state=drain", timeout_seconds=3):
            events.append((ev["type"], ev["object"]["metadata"]["name"]))

    t = threading.Thread(target=collect)
    t.start()
    time.sleep(0.5)
    name = "hpc-compute-7d9f8-abcde"
    co.patch_namespaced_custom_object(G, V, "metal3", "machines", name,
                                      {"metadata": {"labels": {"slurm.example.org/state": "drain"}}})
    co.patch_namespaced_custom_object(G, V, "metal3", "machines", name,
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


def test_unknown_version_is_plain_text_404(sim):
    status, body = raw(sim, "/apis/cluster.x-k8s.io/v1alpha4/namespaces/metal3/machines")
    assert status == 404 and body == "404 page not found\n"
