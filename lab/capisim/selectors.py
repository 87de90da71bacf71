"""Label and field selectors with kube-apiserver's grammar and error messages."""

import re

_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


class SelectorError(ValueError):
    """A selector the real server would answer with 400 BadRequest."""


def valid_label_value(value):
    return isinstance(value, str) and len(value) <= 63 and bool(_VALUE.match(value))


def valid_label_key(key):
    name = key.rsplit("/", 1)[-1]
    return isinstance(key, str) and len(name) <= 63 and bool(_KEY.match(key))


def _tokens(text):
    """Split a selector into identifiers and operators, like the apiserver's lexer."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif text.startswith(("==", "!="), i):
            out.append(text[i:i + 2])
            i += 2
        elif c in "=(),!":
            out.append(c)
            i += 1
        else:
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in "=(),!":
                j += 1
            out.append(text[i:j])
            i = j
    return out


def parse_label_selector(text):
    """Return a list of (key, op, values) requirements; raise SelectorError."""
    toks = _tokens(text or "")
    reqs, pos = [], 0

    def peek():
        return toks[pos] if pos < len(toks) else None

    while pos < len(toks):
        negate = False
        if peek() == "!":
            negate = True
            pos += 1
        key = peek()
        if key is None or key in "=(),!" or key in ("==", "!="):
            raise SelectorError(f"unable to parse requirement: found '{key or ''}', expected: identifier")
        if not valid_label_key(key):
            raise SelectorError(f"unable to parse requirement: invalid label key \"{key}\"")
        pos += 1
        if negate:
            reqs.append((key, "!exists", ()))
        elif peek() in (None, ","):
            reqs.append((key, "exists", ()))
        elif peek() in ("=", "==", "!="):
            op = "!=" if peek() == "!=" else "="
            pos += 1
            value = peek()
            if value in (None, ","):
                value = ""
            else:
                if value in "=()!":
                    raise SelectorError(f"unable to parse requirement: found '{value}', expected: identifier")
                pos += 1
            if not valid_label_value(value):
                raise SelectorError(f"unable to parse requirement: invalid label value: \"{value}\"")
            reqs.append((key, op, (value,)))
        elif peek() in ("in", "notin"):
            op = peek()
            pos += 1
            if peek() != "(":
                raise SelectorError(f"unable to parse requirement: found '{peek() or ''}' expected: '('")
            pos += 1
            values = []
            while True:
                value = peek()
                if value is None:
                    raise SelectorError("unable to parse requirement: found '', expected: ')'")
                if value == ")":
                    pos += 1
                    break
                if value == ",":
                    pos += 1
                    continue
                if not valid_label_value(value):
                    raise SelectorError(f"unable to parse requirement: invalid label value: \"{value}\"")
                values.append(value)
                pos += 1
            reqs.append((key, op, tuple(values)))
        else:
            raise SelectorError(f"unable to parse requirement: found '{peek()}', expected: "
                                "'in', 'notin', '=', '==', '!=', 'gt', 'lt', ')' or ','")
        if peek() == ",":
            pos += 1
        elif peek() is not None:
            raise SelectorError(f"found '{peek()}', expected: ',' or 'end of string'")
    return reqs


def matches(reqs, labels):
    labels = labels or {}
    for key, op, values in reqs:
        present = key in labels
        if op == "exists" and not present:
            return False
        if op == "!exists" and present:
            return False
        if op in ("=", "in") and (not present or labels[key] not in values):
            return False
        if op in ("!=", "notin") and present and labels[key] in values:
            return False
    return True


def parse_field_selector(text):
    """Only metadata.name and metadata.namespace are selectable on these CRDs."""
    reqs = []
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        m = re.match(r"^([^=!]+)(==|=|!=)(.*)$", part)
        if not m:
            raise SelectorError(f"invalid selector: '{part}'; can't understand '{part}'")
        field, op, value = m.groups()
        if field not in ("metadata.name", "metadata.namespace"):
            raise SelectorError(f"field label not supported: {field}")
        reqs.append((field, "!=" if op == "!=" else "=", value))
    return reqs


def field_matches(reqs, obj):
    meta = obj.get("metadata", {})
    for field, op, value in reqs:
        actual = meta.get(field.split(".", 1)[1], "")
        if (actual == value) != (op == "="):
            return False
    return True
