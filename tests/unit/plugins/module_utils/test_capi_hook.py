"""Our deletion hook on a Machine (module_utils/capi_hook.py) on a real kube-apiserver, the Machine read
back from the server: put and released with a merge patch of that one annotation, idempotent, read again
on 409, check mode, a Machine that is missing or being deleted, a bad hook key, and RBAC without the token
in the message."""

from conftest import ADMIN_TOKEN, HOOK, READONLY_TOKEN, make_machine

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiReader, build_configuration
from ansible_collections.converged.hpc.plugins.module_utils.capi_hook import hook_task, set_hook

API = "cluster.x-k8s.io/v1beta2"


def a_machine(world, name):
    make_machine(world.api(), world.ns, name)


def params(world, name="cn-1", state="present", token=ADMIN_TOKEN, hook=HOOK, **extra):
    out = dict(name=name, namespace=world.ns, api_version=API, hook=hook, owner="converged-hpc", state=state,
               **world.auth(token))
    out.update(extra)
    return out


def stored(world, name="cn-1"):
    return world.api().get(API, "machines", world.ns, name)


def patch(world, body, name="cn-1"):
    return world.api().patch(API, "machines", world.ns, name, body)


def test_release_removes_only_our_annotation_once(world):
    a_machine(world, "cn-1")
    patch(world, {"metadata": {"annotations": {"site.example/owner": "hpc-team"}}})
    before = stored(world)["metadata"]["resourceVersion"]
    res = hook_task(params(world, state="absent"), check_mode=False)
    assert res["changed"] is True and res["exists"] is True and HOOK not in res["annotations"], res
    after = stored(world)["metadata"]
    assert after["annotations"] == {"site.example/owner": "hpc-team"}
    assert int(after["resourceVersion"]) > int(before)
    again = hook_task(params(world, state="absent"), check_mode=False)
    assert again["changed"] is False and stored(world)["metadata"]["resourceVersion"] == after["resourceVersion"]


def test_put_adds_the_hook_with_its_owner_once(world):
    a_machine(world, "cn-1")
    assert hook_task(params(world, state="absent"), False)["changed"]
    res = hook_task(params(world, owner="site-hook"), False)
    assert res["changed"] is True and (stored(world)["metadata"].get("annotations") or {})[HOOK] == "site-hook"
    rv = stored(world)["metadata"]["resourceVersion"]
    assert hook_task(params(world), False)["changed"] is False and stored(world)["metadata"]["resourceVersion"] == rv


def test_check_mode_reads_and_writes_nothing(world):
    a_machine(world, "cn-1")
    rv = stored(world)["metadata"]["resourceVersion"]
    res = hook_task(params(world, state="absent"), check_mode=True)
    assert res["changed"] is True and HOOK in (stored(world)["metadata"].get("annotations") or {})
    assert stored(world)["metadata"]["resourceVersion"] == rv


def test_a_missing_machine_has_nothing_to_release_and_cannot_be_held(world):
    res = hook_task(params(world, name="gone", state="absent"), False)
    assert res["changed"] is False and res["exists"] is False and not res.get("failed")
    res = hook_task(params(world, name="gone"), False)
    assert res["failed"] and "Machine %s/gone does not exist" % world.ns in res["msg"], res


def test_a_machine_being_deleted_is_released_and_said_so(world):
    a_machine(world, "cn-1")
    world.api().delete(API, "machines", world.ns, "cn-1")  # its finalizer keeps it, with a deletionTimestamp
    res = hook_task(params(world, state="absent"), False)
    assert res["changed"] is True and res["deleting"] is True, res
    assert HOOK not in (stored(world)["metadata"].get("annotations") or {})


class Meddling(CapiReader):
    """Someone else writes the Machine between our read and our patch, once."""

    def __init__(self, world, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.world, self.meddled, self.patches = world, False, []

    def request(self, path, query=None, method="GET", body=None, content_type="application/json"):
        if method == "PATCH":
            self.patches.append(body)
            if not self.meddled:
                self.meddled = True
                patch(self.world, {"metadata": {"labels": {"site.example/rack": "r7"}}})
        return super().request(path, query, method, body, content_type)


def test_a_machine_changed_between_read_and_patch_is_read_again(world):
    a_machine(world, "cn-1")
    configuration, headers = build_configuration(**world.auth())
    reader = Meddling(world, configuration, headers=headers)
    changed, machine = set_hook(reader, API, world.ns, "cn-1", HOOK, "converged-hpc", present=False)
    assert changed and len(reader.patches) == 2  # the first carried the old resourceVersion: 409
    assert reader.patches[0]["metadata"]["resourceVersion"] != reader.patches[1]["metadata"]["resourceVersion"]
    final = stored(world)["metadata"]
    assert HOOK not in (final.get("annotations") or {}) and final["labels"]["site.example/rack"] == "r7"  # theirs kept


def test_a_key_that_is_no_deletion_hook_is_refused_before_any_request(world):
    res = hook_task(params(world, hook="converged-hpc", host="http://127.0.0.1:9"), False)
    assert res["failed"] and "'converged-hpc' is not a Cluster API deletion hook" in res["msg"], res


def test_forbidden_names_the_machine_and_never_the_token(world):
    a_machine(world, "cn-1")
    res = hook_task(params(world, state="absent", token=READONLY_TOKEN), False)
    assert res["failed"] and "Machine %s/cn-1" % world.ns in res["msg"] and "403" in res["msg"], res
    assert READONLY_TOKEN not in res["msg"] and HOOK in (stored(world)["metadata"].get("annotations") or {})
