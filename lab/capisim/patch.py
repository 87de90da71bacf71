"""JSON merge patch (RFC 7386) and JSON patch (RFC 6902), as kube-apiserver applies them to custom resources,
and the strategic merge patch it also takes for its built-in kinds (the simulator's: Namespace, Secret,
ConfigMap, Lease)."""

import copy


class JsonPatchError(ValueError):
    pass


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class UnsupportedDirective(ValueError):
    """A strategic merge patch directive ($patch, $retainKeys...) the simulator does not apply."""


# ObjectMeta's lists with a merge strategy (the only ones the built-in kinds served here have):
# finalizers are merged as a set, ownerReferences by uid; every other list is replaced
_MERGED_LISTS = {("metadata", "finalizers"): None, ("metadata", "ownerReferences"): "uid"}


def strategic_merge_patch(target, patch, path=()):
    """A strategic merge patch of a built-in kind: a merge patch, but for ObjectMeta's merged lists (the
    patch's items first, in its order, each merged with the item of the same key; then the items it does
    not name) and a map's $patch directive (replace: the map is the patch's; delete: it goes)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return strategic_merge_patch({}, {k: v for k, v in patch.items() if k != "$patch"}, path)
    if directive is not None and directive != "delete":
        raise UnsupportedDirective("the simulator does not apply the strategic merge patch directive "
                                   "$patch: %s" % directive)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch":
            continue
        if key.startswith("$"):
            raise UnsupportedDirective("the simulator does not apply the strategic merge patch directive %s" % key)
        here = path + (key,)
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            out.pop(key, None)
        elif here in _MERGED_LISTS and isinstance(value, list) and isinstance(out.get(key), list):
            merge_key = _MERGED_LISTS[here]

            def key_of(item):
                return item if merge_key is None else (item.get(merge_key) if isinstance(item, dict) else None)

            old = {key_of(item): item for item in out[key]}
            merged, named = [], set()
            for item in value:
                k = key_of(item)
                if k in named:
                    continue
                named.add(k)
                merged.append(merge_patch(old[k], item) if merge_key is not None and k in old else item)
            merged += [item for item in out[key] if key_of(item) not in named]
            out[key] = copy.deepcopy(merged)
        else:
            out[key] = strategic_merge_patch(out.get(key), value, here) if isinstance(value, dict) \
                else copy.deepcopy(value)
    return out


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise JsonPatchError(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts):
    for part in parts:
        if isinstance(doc, list):
            try:
                doc = doc[int(part)]
            except (ValueError, IndexError):
                raise JsonPatchError(f"no element {part}")
        elif isinstance(doc, dict):
            if part not in doc:
                raise JsonPatchError(f"no key {part}")
            doc = doc[part]
        else:
            raise JsonPatchError(f"cannot descend into {part}")
    return doc


def _add(doc, parts, value):
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        idx = len(parent) if last == "-" else int(last)
        if idx > len(parent):
            raise JsonPatchError("index out of range")
        parent.insert(idx, value)
    elif isinstance(parent, dict):
        parent[last] = value
    else:
        raise JsonPatchError("parent is not a container")
    return doc


def _remove(doc, parts):
    if not parts:
        raise JsonPatchError("cannot remove the root")
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    try:
        if isinstance(parent, list):
            return parent.pop(int(last))
        return parent.pop(last)
    except (KeyError, IndexError, ValueError, AttributeError):
        raise JsonPatchError(f"missing {last}")


def json_patch(target, operations):
    if not isinstance(operations, list):
        raise JsonPatchError("a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise JsonPatchError("malformed operation")
        parts = _pointer(op["path"])
        kind = op["op"]
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _remove(doc, parts)
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise JsonPatchError("test failed")
        elif kind in ("move", "copy"):
            value = _walk(doc, _pointer(op["from"]))
            if kind == "move":
                _remove(doc, _pointer(op["from"]))
            doc = _add(doc, parts, copy.deepcopy(value))
        else:
            raise JsonPatchError(f"unknown op {kind}")
    return doc
