"""CapiReader's lists: the next page asked for while one is decoded, several kinds at once, and the
token read from a page's end as a real kube-apiserver writes it."""

import copy
import json
import os

import pytest

from conftest import ADMIN_TOKEN, READONLY_TOKEN, REPO
from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (
    CapiApiError,
    CapiReader,
    build_configuration,
    continue_token,
    without_managed_fields,
)

TRANSCRIPTS = os.path.join(os.path.dirname(REPO), "shared", "k8s", "transcripts")
G, V = "cluster.x-k8s.io", "v1beta2"


def recorded_page(name):
    with open(os.path.join(TRANSCRIPTS, name)) as fh:
        body = json.load(fh)["response"]["body"]
    # the server's compact JSON, its keys in the order it wrote them (apiVersion, items, kind, metadata)
    return body, json.dumps(body, separators=(",", ":")).encode()


@pytest.fixture
def server(recorded_server):
    return recorded_server


def reader(server, token=ADMIN_TOKEN, page_size=3):
    configuration, headers = build_configuration(host=server.url, api_key=token, ca_cert=server.ca_cert)
    return CapiReader(configuration, page_size=page_size, headers=headers)


@pytest.mark.skipif(not os.path.isdir(TRANSCRIPTS), reason="the recorded transcripts are not next to the repository")
@pytest.mark.parametrize("name", ["30-list-machines-limit2-page1.json", "31-list-machines-limit2-page2.json",
                                  "32-list-machines-limit4-page3.json"])
def test_continue_token_read_from_the_end_of_a_recorded_page(name):
    body, raw = recorded_page(name)
    assert list(body) == ["apiVersion", "items", "kind", "metadata"]
    assert continue_token(raw) == body["metadata"]["continue"]


def test_continue_token_absent_or_not_at_the_end_is_none():
    last = {"apiVersion": "v1", "items": [{"metadata": {"name": "a"}}], "kind": "MachineList",
            "metadata": {"resourceVersion": "7"}}
    assert continue_token(json.dumps(last).encode()) is None
    first = {"metadata": {"continue": "abc"}, "items": [{"metadata": {"name": "a", "labels": {}}}]}
    assert continue_token(json.dumps(first).encode()) is None
    # an item's annotation called "continue" is no list token
    tricky = {"apiVersion": "v1", "items": [{"metadata": {"annotations": {"continue": "x"}}}]}
    assert continue_token(json.dumps(tricky).encode()) is None
    assert continue_token(b"not json at all") is None


def _no_managed_fields(body):
    for item in body["items"]:
        item["metadata"].pop("managedFields", None)
    return body


@pytest.mark.skipif(not os.path.isdir(TRANSCRIPTS), reason="the recorded transcripts are not next to the repository")
@pytest.mark.parametrize("name", ["20-list-machines-all-v1beta2.json", "37-list-metal3machines-all-v1beta2.json",
                                  "38-list-baremetalhosts-all.json", "30-list-machines-limit2-page1.json"])
def test_managed_fields_cut_from_a_recorded_page_and_nothing_else(name):
    body, raw = recorded_page(name)
    assert any(item["metadata"].get("managedFields") for item in body["items"])
    lean = without_managed_fields(raw)
    assert b'"managedFields"' not in lean and len(lean) < 0.8 * len(raw)
    assert json.loads(lean) == _no_managed_fields(body)


@pytest.mark.skipif(not os.path.isdir(TRANSCRIPTS), reason="the recorded transcripts are not next to the repository")
def test_a_page_not_laid_out_as_the_server_writes_it_is_decoded_whole():
    body, raw = recorded_page("20-list-machines-all-v1beta2.json")
    pretty = json.dumps(body, indent=1).encode()
    assert without_managed_fields(pretty) is pretty
    # managedFields last in the metadata (not sorted): the next array of objects followed by a key must
    # not be taken for its end, which would cut the spec and status away with it
    unsorted = copy.deepcopy(body)
    for item in unsorted["items"]:
        item["metadata"]["managedFields"] = item["metadata"].pop("managedFields")
    raw = json.dumps(unsorted, separators=(",", ":")).encode()
    assert without_managed_fields(raw) is raw
    # an entry without its time, an empty array
    for change in (lambda e: e.pop("time"), lambda e: e.clear()):
        odd = copy.deepcopy(body)
        change(odd["items"][-1]["metadata"]["managedFields"][-1])
        raw = json.dumps(odd, separators=(",", ":")).encode()
        assert without_managed_fields(raw) is raw
    empty = copy.deepcopy(body)
    empty["items"][-1]["metadata"]["managedFields"] = []
    raw = json.dumps(empty, separators=(",", ":")).encode()
    assert without_managed_fields(raw) is raw
    # an annotation that quotes one is a string, escaped: not cut
    quoted = copy.deepcopy(body)
    for item in quoted["items"]:
        item["metadata"].pop("managedFields")
    quoted["items"][0]["metadata"]["annotations"] = {"x": json.dumps({"managedFields": [{"time": "1Z"}], "name": "n"})}
    raw = json.dumps(quoted, separators=(",", ":"), sort_keys=True).encode()
    assert without_managed_fields(raw) is raw


def test_a_list_without_managed_fields_has_every_other_field(server):
    rd = reader(server)
    try:
        full = rd.list(G, V, "machines")
        lean = rd.list(G, V, "machines", managed_fields=False)
    finally:
        rd.close()
    assert len(lean) == 10 and all(m["metadata"].get("managedFields") for m in full)
    for m in full:
        m["metadata"].pop("managedFields")
    assert lean == full


def test_look_ahead_lists_the_same_items_in_as_many_requests(server):
    plain, ahead = reader(server), reader(server)
    plain.look_ahead = False
    original, sent = ahead.request, []

    def request(path, query=None, **kwargs):
        sent.append((path, dict(query or {})))
        return original(path, query, **kwargs)

    ahead.request = request
    try:
        want = plain.list(G, V, "machines")
        got = ahead.list(G, V, "machines")
    finally:
        plain.close()
        ahead.close()
    assert [m["metadata"]["name"] for m in got] == [m["metadata"]["name"] for m in want]
    assert len(got) == 10
    pages = [q for p, q in sent if p.endswith("/machines")]
    assert len(pages) == 4 and ahead.requests == 4  # 10 Machines, 3 a page: no request wasted
    assert [q.get("continue") is None for q in pages] == [True, False, False, False]


def test_look_ahead_restarts_when_the_token_expired(server):
    """The page asked for ahead comes back 410 (its token outlived by an etcd compaction and a kube-apiserver
    restart): the list starts again, whole."""
    rd = reader(server)
    original, compacted = rd.request, []

    firsts = []

    def request(path, query=None, **kwargs):
        if not (query or {}).get("continue"):
            firsts.append(path)
        if query and query.get("continue") and not compacted:
            compacted.append(True)
            server.compact()
            server.restart_apiserver()
        return original(path, query, **kwargs)

    rd.request = request
    try:
        got = rd.list(G, V, "machines")
    finally:
        rd.close()
    assert compacted and len(got) == 10 and len(firsts) == 2  # the 410: a first page asked again
    assert len({m["metadata"]["name"] for m in got}) == 10


def test_transform_is_applied_to_every_item(server):
    rd = reader(server)
    try:
        names = rd.list(G, V, "machines", transform=lambda m: m["metadata"]["name"])
    finally:
        rd.close()
    assert len(names) == 10 and all(isinstance(n, str) for n in names)


def test_several_lists_at_once_each_with_its_own_answer(server):
    rd = reader(server, token=READONLY_TOKEN)
    try:
        out = rd.list_many({"machines": ((G, V, "machines"), {}),
                            "bmh": (("metal3.io", "v1alpha1", "baremetalhosts"), {})})
    finally:
        rd.close()
    assert len(out["machines"]) == 10
    assert isinstance(out["bmh"], CapiApiError) and "403 Forbidden" in str(out["bmh"])


def test_many_lists_with_look_aheads_never_wait_on_each_other(server):
    """More lists than a pool has threads, every one with pages to look ahead for."""
    rd = reader(server, page_size=1)
    try:
        out = rd.list_many({i: ((G, V, "machines"), {}) for i in range(12)})
    finally:
        rd.close()
    assert all(len(items) == 10 for items in out.values())
