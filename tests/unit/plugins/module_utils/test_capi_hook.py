"""Our deletion hook on a Machine (module_utils/capi_hook.py) against the simulator: put and released
with a merge patch of that one annotation, idempotent, read again on 409, check mode, a Machine that
is missing or being deleted, a bad hook key, and RBAC without the token in the message."""

import copy

from conftest import ADMIN_TOKEN, HOOK, READONLY_TOKEN, a_machine, machines

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiReader, build_configuration
from ansible_collections.converged.hpc.plugins.module_utils.capi_hook import hook_task, set_hook

API = "cluster.x-k8s.io/v1beta2"


def params(sim, name="cn-1", state="present", token=ADMIN_TOKEN, hook=HOOK, **extra):
    out = dict(name=name, namespace="metal3", api_version=API, hook=hook, owner="converged-hpc", state=state,
               host=sim.url, api_key=token)
    out.update(extra)
    return out


def stored(sim, name="cn-1"):
    return sim.store.get(machines(sim), "metal3", name)


def test_release_removes_only_our_annotation_once(world):
    a_machine(world, "cn-1")
    obj = copy.deepcopy(stored(world))
    obj["metadata"]["annotations"]["site.example/owner"] = "hpc-team"
    world.store.update(machines(world), "metal3", "cn-1", obj)
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
    assert res["changed"] is True and stored(world)["metadata"]["annotations"][HOOK] == "site-hook"
    rv = stored(world)["metadata"]["resourceVersion"]
    assert hook_task(params(world), False)["changed"] is False and stored(world)["metadata"]["resourceVersion"] == rv


def test_check_mode_reads_and_writes_nothing(world):
    a_machine(world, "cn-1")
    rv = stored(world)["metadata"]["resourceVersion"]
    res = hook_task(params(world, state="absent"), check_mode=True)
    assert res["changed"] is True and HOOK in stored(world)["metadata"]["annotations"]
    assert stored(world)["metadata"]["resourceVersion"] == rv


def test_a_missing_machine_has_nothing_to_release_and_cannot_be_held(world):
    res = hook_task(params(world, name="gone", state="absent"), False)
    assert res["changed"] is False and res["exists"] is False and not res.get("failed")
    res = hook_task(params(world, name="gone"), False)
    assert res["failed"] and "Machine metal3/gone does not exist" in res["msg"], res


def test_a_machine_being_deleted_is_released_and_said_so(world):
    a_machine(world, "cn-1")
    world.store.delete(machines(world), "metal3", "cn-1")  # its finalizer keeps it, with a deletionTimestamp
    res = hook_task(params(world, state="absent"), False)
    assert res["changed"] is True and res["deleting"] is True, res
    assert HOOK not in stored(world)["metadata"]["annotations"]


class Meddling(CapiReader):
    """Someone else writes the Machine between our read and our patch, once."""

    def __init__(self, sim, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sim, self.meddled, self.patches = sim, False, []

    def request(self, path, query=None, method="GET", body=None, content_type="application/json"):
        if method == "PATCH":
            self.patches.append(body)
            if not self.meddled:
                self.meddled = True
                obj = copy.deepcopy(stored(self.sim))
                obj["metadata"]["labels"]["site.example/rack"] = "r7"
                self.sim.store.update(machines(self.sim), "metal3", "cn-1", obj)
        return super().request(path, query, method, body, content_type)


def test_a_machine_changed_between_read_and_patch_is_read_again(world):
    a_machine(world, "cn-1")
    configuration, headers = build_configuration(host=world.url, api_key=ADMIN_TOKEN)
    reader = Meddling(world, configuration, headers=headers)
    changed, machine = set_hook(reader, API, "metal3", "cn-1", HOOK, "converged-hpc", present=False)
    assert changed and len(reader.patches) == 2  # the first carried the old resourceVersion: 409
    assert reader.patches[0]["metadata"]["resourceVersion"] != reader.patches[1]["metadata"]["resourceVersion"]
    final = stored(world)["metadata"]
    assert HOOK not in final["annotations"] and final["labels"]["site.example/rack"] == "r7"  # theirs kept


def test_a_key_that_is_no_deletion_hook_is_refused_before_any_request(world):
    res = hook_task(params(world, hook="converged-hpc", host="http://127.0.0.1:9"), False)
    assert res["failed"] and "'converged-hpc' is not a Cluster API deletion hook" in res["msg"], res


def test_forbidden_names_the_machine_and_never_the_token(world):
    a_machine(world, "cn-1")
    res = hook_task(params(world, state="absent", token=READONLY_TOKEN), False)
    assert res["failed"] and "Machine metal3/cn-1" in res["msg"] and "403" in res["msg"], res
    assert READONLY_TOKEN not in res["msg"] and HOOK in stored(world)["metadata"]["annotations"]
