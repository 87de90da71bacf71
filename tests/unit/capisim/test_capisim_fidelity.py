"""The simulator answers the recorded requests the way the real kube-apiserver did.

Each case replays one exchange of shared/k8s/transcripts against a backend loaded with the same
objects, and compares status, reason and message (the message only where it carries no Go-internal
detail). The backends: the simulator, and, with $KUBEBUILDER_ASSETS, the real kube-apiserver the
transcripts were recorded from (the same binary, holding the same objects): each case passes on
both, or the simulator is wrong.
"""

import json
import os

import pytest

from conftest import ADMIN_TOKEN, READONLY_TOKEN, TRANSCRIPTS
import capisim.resources as res_mod

# transcript, compare message exactly?
CASES = [
    ("27-list-machines-label-bad-selector.json", True),
    ("29-list-machines-fieldselector-unsupported.json", True),
    ("33-list-machines-continue-garbage.json", False),
    ("34-list-machines-continue-not-base64.json", True),
    ("57-get-machine-missing-404.json", True),
    ("58-get-machine-missing-namespace-404.json", True),
    ("63-get-unknown-version-404.json", True),
    ("71-readonly-list-baremetalhosts-403.json", True),
    ("72-readonly-get-metal3machine-403.json", True),
    ("73-readonly-patch-machine-403.json", True),
    ("75-no-token-anonymous-403.json", True),
    ("76-invalid-token-401.json", True),
    ("82-json-patch-remove-missing-annotation.json", True),
    ("84-strategic-merge-patch-unsupported-415.json", True),
    ("88-create-machine-wrong-kind-422.json", True),
    ("89-create-machine-already-exists-409.json", True),
    ("23-list-machines-label-eq.json", None),
    ("24-list-machines-label-set-in.json", None),
    ("25-list-machines-label-not-exists.json", None),
    ("26-list-machines-label-multi.json", None),
    ("28-list-machines-fieldselector-name.json", None),
    ("22-list-machines-ns-metal3-v1beta2.json", None),
]

pytestmark = pytest.mark.skipif(not os.path.isdir(TRANSCRIPTS), reason="shared/k8s/transcripts not beside the repo")


def replay(backend, exchange):
    req = exchange["request"]
    headers = {}
    for key, value in (req.get("headers") or {}).items():
        if key.lower() == "authorization":
            value = value.replace("<admin-token>", ADMIN_TOKEN).replace("<readonly-token>", READONLY_TOKEN)
            if value == "Bearer <invalid-token>" or "invalid" in value:
                value = "Bearer not-a-known-token"
        # the recording's notes on a value, as in "*/* (curl default)", are not part of it
        headers[key] = value.split(" (")[0]
    if not any(k.lower() == "authorization" for k in headers) and "no-token" not in exchange.get("note", "") \
            and "75-" not in exchange.get("_file", ""):
        headers["Authorization"] = "Bearer " + ADMIN_TOKEN
    body = req.get("body")
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "application/json")
    return backend.api(token="").request(req["method"], req["path"], body, content_type, query=req.get("query"),
                                         headers=headers, raw=True)


@pytest.mark.parametrize("name,exact", CASES)
def test_replay_matches_recorded_response(backend, name, exact):
    with open(os.path.join(TRANSCRIPTS, name)) as fh:
        exchange = json.load(fh)
    exchange["_file"] = name
    # the recorded server has this Machine before the create-conflict call
    status, data = replay(backend, exchange)
    want = exchange["response"]
    assert status == want["status"], data
    if "body_raw" in want and "body" not in want:
        assert data.decode() == want["body_raw"]
        return
    got = json.loads(data)
    if exact is None:  # a list: same Machines (of the recorded namespaces: others are other tests')
        recorded = {i["metadata"]["namespace"] for i in want["body"]["items"]} | {"metal3", "lab2"}
        assert sorted(i["metadata"]["name"] for i in got["items"] if i["metadata"]["namespace"] in recorded) == \
            sorted(i["metadata"]["name"] for i in want["body"]["items"])
        return
    assert got["kind"] == "Status" and got["code"] == want["body"]["code"]
    assert got.get("reason") == want["body"].get("reason")
    if exact:
        assert got["message"] == want["body"]["message"]


def test_resource_table_matches_the_real_crds():
    crds = os.path.join(os.path.dirname(TRANSCRIPTS), "crds")
    import yaml
    table = {(r.group, r.plural): r for r in res_mod.RESOURCES}
    for name in sorted(os.listdir(crds)):
        with open(os.path.join(crds, name)) as fh:
            spec = yaml.safe_load(fh)["spec"]
        r = table[(spec["group"], spec["names"]["plural"])]
        served = [v for v in spec["versions"] if v["served"]]
        storage = [v["name"] for v in served if v.get("storage")][0]
        assert r.kind == spec["names"]["kind"]
        assert r.preferred == storage
        assert set(r.versions) == {v["name"] for v in served}
        assert set(r.short_names) == set(spec["names"].get("shortNames") or [])
        assert set(r.categories) == set(spec["names"].get("categories") or [])
        assert set(r.subresources) == set(served[0].get("subresources") or {})
        assert r.namespaced == (spec["scope"] == "Namespaced")


def test_managed_fields_as_the_recorded_server_returns_them(backend):
    # the fixture objects were recorded with managedFields dropped; the simulator writes them
    # back as the controller's own, field for field, so responses have the real server's size
    with open(os.path.join(TRANSCRIPTS, "50-get-machine-v1beta2.json")) as fh:
        exchange = json.load(fh)
    status, data = replay(backend, exchange)
    got, want = json.loads(data), exchange["response"]["body"]
    strip = ("time",)
    assert [{k: v for k, v in e.items() if k not in strip} for e in got["metadata"]["managedFields"]] == \
        [{k: v for k, v in e.items() if k not in strip} for e in want["metadata"]["managedFields"]]
    assert len(json.dumps(got)) >= 0.95 * len(json.dumps(want))


def _keys_sorted(value, path="", out=None):
    """Where a JSON value's mappings have their keys out of sorted order."""
    out = [] if out is None else out
    if isinstance(value, dict):
        if list(value) != sorted(value):
            out.append(path or "/")
        for key, item in value.items():
            _keys_sorted(item, path + "/" + key, out)
    elif isinstance(value, list):
        for item in value:
            _keys_sorted(item, path + "[]", out)
    return out


def test_custom_resources_are_written_with_their_keys_sorted(backend):
    # as the recorded server wrote them (an unstructured object is a map, encoded with sorted keys): a
    # list's metadata comes last, each object's managedFields just before its name
    for name in ("20-list-machines-all-v1beta2.json", "37-list-metal3machines-all-v1beta2.json",
                 "38-list-baremetalhosts-all.json", "50-get-machine-v1beta2.json"):
        with open(os.path.join(TRANSCRIPTS, name)) as fh:
            exchange = json.load(fh)
        assert _keys_sorted(exchange["response"]["body"]) == [], name
        status, data = replay(backend, exchange)
        assert status == 200 and _keys_sorted(json.loads(data)) == [], name
        assert data.startswith(b'{"apiVersion":') and b'"managedFields":[' in data, name
