"""metadata.managedFields as kube-apiserver keeps them (FieldsV1), for the byte sizes and
shapes a client meets: every write records, under its field manager (the `fieldManager`
query parameter, else the User-Agent up to its first '/'), the fields it set, merged with
what that manager set before; status writes are entries of their own (subresource status).
Not modelled: taking fields away from other managers, server-side apply."""

import json

# lists the real server merges by a key (fieldsV1 "k:{...}") or keeps as a set ("v:...");
# every other list is atomic (one leaf, e.g. status.addresses)
# (the recorded server lists an ownerReference by its uid only, a condition with its fields)
_KEYED = {"conditions": "type", "ownerReferences": "uid", "nics": "name"}
_KEY_ONLY = ("ownerReferences",)
_SETS = ("finalizers",)
_META = ("annotations", "finalizers", "labels", "ownerReferences")


def fields_v1(value, name=None):
    if isinstance(value, dict):
        out = {".": {}}
        for key in sorted(value):
            out["f:" + key] = fields_v1(value[key], key)
        return out
    if isinstance(value, list):
        key = _KEYED.get(name)
        if key and all(isinstance(i, dict) and key in i for i in value):
            out = {".": {}}
            for item in value:
                out["k:" + json.dumps({key: item[key]}, separators=(",", ":"))] = \
                    {} if name in _KEY_ONLY else fields_v1(item)
            return out
        if name in _SETS and all(isinstance(i, str) for i in value):
            out = {".": {}}
            for item in value:
                out["v:" + json.dumps(item)] = {}
            return out
    return {}


def _changed(old, new, name=None):
    """The fields of new that differ from old (None: nothing)."""
    if old == new:
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        out = {}
        for key in sorted(new):
            sub = _changed(old.get(key), new[key], key) if key in old else fields_v1(new[key], key)
            if sub is not None:
                out["f:" + key] = sub
        return out or None
    return fields_v1(new, name)


def _merge(into, more):
    for key, value in more.items():
        _merge(into.setdefault(key, {}), value)
    return into


def _object_fields(old, new, subresource):
    """What this write set: status for the status subresource, else metadata (the parts a
    client sets) and everything beside status."""
    def part(obj):
        obj = obj or {}
        if subresource == "status":
            return {"status": obj["status"]} if "status" in obj else {}
        out = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k in _META and v}
        if meta:
            out["metadata"] = meta
        return out
    fields = _changed(part(old), part(new)) or {}
    if "f:metadata" in fields:
        fields["f:metadata"].pop(".", None)  # as recorded: f:metadata has no "." of its own
    return fields


def record(old, new, manager, subresource, api_version, time):
    """new's managedFields after `manager` wrote it (old is None on create)."""
    entries = [dict(e) for e in ((old or {}).get("metadata") or {}).get("managedFields") or []]
    sub = subresource if subresource in ("status", "scale") else None
    fields = _object_fields(old, new, "status" if sub == "status" else None)
    if not fields:
        return entries
    for entry in entries:
        if entry.get("manager") == manager and entry.get("operation") == "Update" and entry.get("subresource") == sub:
            entry["fieldsV1"] = _merge(json.loads(json.dumps(entry.get("fieldsV1") or {})), fields)
            entry["time"], entry["apiVersion"] = time, api_version
            return entries
    entry = {"apiVersion": api_version, "fieldsType": "FieldsV1", "fieldsV1": fields, "manager": manager,
             "operation": "Update", "time": time}
    if sub:
        entry["subresource"] = sub
    return entries + [entry]


def manager_from(query, user_agent):
    """The field manager of a request, as the real server derives it."""
    if query.get("fieldManager"):
        return query["fieldManager"][:128]
    return ((user_agent or "").split("/")[0] or "unknown")[:128]
