"""HTTP front of the simulator: kube-apiserver's URL layout, discovery, auth,
lists with selectors and paging, watch streams, create/replace/patch/delete,
the status and scale subresources. Error bodies are Status objects shaped like
the recorded responses in shared/k8s/transcripts.
"""

import copy
import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from .fields import manager_from
from .patch import JsonPatchError, UnsupportedDirective, json_patch, merge_patch, strategic_merge_patch
from .selectors import SelectorError, field_matches, matches, parse_field_selector, parse_label_selector
from .store import ApiError, Store, _details

VERSION_INFO = {
    "major": "1", "minor": "36", "emulationMajor": "1", "emulationMinor": "36",
    "minCompatibilityMajor": "1", "minCompatibilityMinor": "35",
    "gitVersion": "v1.36.2-capisim", "gitCommit": "capisim", "gitTreeState": "clean",
    "buildDate": "2026-11-22T00:00:00Z", "goVersion": "n/a", "compiler": "n/a", "platform": "linux/amd64",
}
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json")
# a kind the server has built in also takes a strategic merge patch (a custom resource: 415)
STRATEGIC = "application/strategic-merge-patch+json"
_V1BETA1_DROP = {"spec": ("deletion",), "status": ("initialization",)}


class Forbidden(ApiError):
    def __init__(self, user, verb, res, namespace, name=None, sub=None):
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        what = f'{res.group_resource} "{name}"' if name else res.group_resource
        details = {"name": name} if name else {}
        details.update(group=res.group, kind=res.plural)
        resource = f"{res.plural}/{sub}" if sub else res.plural
        super().__init__(403, "Forbidden", f'{what} is forbidden: User "{user}" cannot {verb} '
                         f'resource "{resource}" in API group "{res.group}" {scope}', details)


class Identity:
    """A bearer token's user; rules None means cluster-admin. A rule is (group, resource, verb), the
    resource of a subresource named as RBAC names it (machinedeployments/scale)."""

    def __init__(self, user, rules=None):
        self.user, self.rules = user, rules

    def allowed(self, verb, res, sub=None):
        if self.rules is None:
            return True
        return (res.group, f"{res.plural}/{sub}" if sub else res.plural, verb) in self.rules


def served(obj, res, version):
    """Serve a stored object at a version: strategy None only rewrites apiVersion,
    then prunes to that version's schema (what v1beta1 lacks)."""
    if version == res.preferred:
        return obj
    out = dict(obj)
    out["apiVersion"] = res.api_version(version)
    if res.group.endswith("cluster.x-k8s.io") and version == "v1beta1":
        for part, drops in _V1BETA1_DROP.items():
            if isinstance(out.get(part), dict):
                out[part] = {k: v for k, v in out[part].items() if k not in drops}
        spec = out.get("spec")
        if isinstance(spec, dict):
            spec = dict(spec)
            for ref in ("infrastructureRef",):
                if isinstance(spec.get(ref), dict):
                    spec[ref] = {k: v for k, v in spec[ref].items() if k != "apiGroup"}
            if isinstance(spec.get("bootstrap"), dict) and isinstance(spec["bootstrap"].get("configRef"), dict):
                spec["bootstrap"] = dict(spec["bootstrap"])
                spec["bootstrap"]["configRef"] = {k: v for k, v in spec["bootstrap"]["configRef"].items()
                                                  if k != "apiGroup"}
            out["spec"] = spec
    return out


class Simulator:
    """Bundles the store, the identities and the HTTP server."""

    def __init__(self, store=None, tokens=None, host="127.0.0.1", port=0, tls=None):
        self.store = store or Store()
        self.tokens = tokens or {}
        handler = type("Handler", (_Handler,), {"sim": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(tls[0], tls[1])
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.thread = None
        self.requests = []  # (method, path, query) of every request, for tests and benchmarks

    @property
    def url(self):
        host, port = self.httpd.server_address[:2]
        return f"{self.scheme}://{host}:{port}"

    def start(self):
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="capisim", daemon=True)
        self.thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        with self.store.lock:
            self.store.changed.notify_all()

    # -------------------------------------------------------------- discovery
    def groups(self):
        out = {}
        for res in self.store.resources.values():
            if res.group:
                out.setdefault(res.group, res.versions)
        return out

    def resource_list(self, group, version):
        entries = []
        for res in sorted(self.store.resources.values(), key=lambda r: r.plural):
            if res.group != group or version not in res.versions:
                continue
            entry = {"name": res.plural, "singularName": res.singular, "namespaced": res.namespaced,
                     "kind": res.kind,
                     "verbs": ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]}
            if res.short_names:
                entry["shortNames"] = list(res.short_names)
            if res.categories:
                entry["categories"] = list(res.categories)
            entries.append(entry)
            for sub in res.subresources:
                sub_entry = {"name": f"{res.plural}/{sub}", "singularName": "", "namespaced": res.namespaced,
                             "kind": res.kind, "verbs": ["get", "patch", "update"]}
                if sub == "scale":
                    sub_entry.update(group="autoscaling", version="v1", kind="Scale")
                entries.append(sub_entry)
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version, "resources": entries}


_PATH_RESOURCE = re.compile(r"^/(?:api/[^/]+|apis/[^/]+/[^/]+)/[^/]+")
_PATH = re.compile(r"^/(?:api/(?P<cv>[^/]+)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))(?P<rest>(?:/[^/]+)*)/?$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sim = None  # set by Simulator
    server_version = "capisim"

    def log_message(self, fmt, *args):  # quiet; the lab logs requests only on demand
        pass

    # ---------------------------------------------------------------- output
    def _send(self, code, body, content_type="application/json", headers=None, res=None):
        """res: the resource the body is an object or a list of; a custom resource's keys are sorted,
        as a real kube-apiserver writes them (a client may rely on a list's metadata coming last)."""
        sort = res is not None and not res.builtin
        data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":"), sort_keys=sort).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _not_found_text(self):
        self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

    def _read_body(self):
        raw = self._raw
        try:
            return json.loads(raw) if raw else None
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the object provided is unrecognized: {exc}")

    # ---------------------------------------------------------------- auth
    def _identity(self):
        auth = self.headers.get("Authorization")
        if not auth:
            return Identity("system:anonymous", rules=set())
        if not auth.startswith("Bearer ") or auth[7:].strip() not in self.sim.tokens:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return self.sim.tokens[auth[7:].strip()]

    # ---------------------------------------------------------------- routing
    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method):
        # Read the whole body first, whatever the answer: a body left unread would be parsed as the
        # next request on this keep-alive connection (the real API server never does that).
        length = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(length) if length else b""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        self.sim.requests.append((method, url.path, query))
        try:
            who = self._identity()
            if url.path == "/version":
                return self._send(200, VERSION_INFO)
            anonymous = who.user == "system:anonymous"
            if anonymous and not _PATH_RESOURCE.match(url.path):
                # discovery is bound to system:authenticated only
                raise ApiError(403, "Forbidden", f'forbidden: User "system:anonymous" cannot {method.lower()} '
                               f'path "{url.path}"', {})
            if url.path.startswith("/_sim/"):
                return self._admin(method, url.path, who)
            if url.path in ("/api", "/api/"):
                return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": "%s:%s" % self.server.server_address[:2]}]})
            if url.path in ("/apis", "/apis/"):
                return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                    self._group(g, vs) for g, vs in sorted(self.sim.groups().items())]})
            parts = url.path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "apis":
                versions = self.sim.groups().get(parts[1])
                if not versions:
                    return self._not_found_text()
                return self._send(200, dict(kind="APIGroup", apiVersion="v1", **self._group(parts[1], versions)))
            m = _PATH.match(url.path)
            if not m:
                return self._not_found_text()
            group, version = ("", m["cv"]) if m["cv"] else (m["g"], m["v"])
            served_versions = ("v1",) if not group else self.sim.groups().get(group, ())
            if version not in served_versions:
                return self._not_found_text()
            rest = [p for p in m["rest"].split("/") if p]
            if not rest:
                return self._send(200, self.sim.resource_list(group, version))
            return self._resource(method, group, version, rest, query, who)
        except ApiError as err:
            self._send(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    @staticmethod
    def _group(name, versions):
        vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": vs, "preferredVersion": vs[0]}

    def _resource(self, method, group, version, rest, query, who):
        store = self.sim.store
        namespace = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        plural, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
        if len(rest) > 3:
            return self._not_found_text()
        res = store.resource(group, plural)
        if res is None or (sub and sub not in res.subresources):
            return self._not_found_text()
        if namespace is not None and not res.namespaced:
            return self._not_found_text()
        watching = method == "GET" and query.get("watch") in ("1", "true")
        verb = {"GET": "watch" if watching else ("get" if name else "list"), "POST": "create",
                "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        if not who.allowed(verb, res, sub):
            raise Forbidden(who.user, verb, res, namespace, name, sub)
        if res.namespaced and namespace is not None and method != "POST" and plural != "namespaces":
            pass  # a missing namespace answers like a missing object (NotFound on get)
        if method == "POST" and res.namespaced:
            self._require_namespace(namespace)
        dry_run = self._dry_run(method, query)
        manager = manager_from(query, self.headers.get("User-Agent"))
        if method == "GET" and not name:
            return self._watch(res, version, namespace, query) if watching else \
                self._list(res, version, namespace, query)
        if method == "POST" and not name:
            body = self._read_body()
            obj = store.create(res, namespace, body or {}, dry_run=dry_run, manager=manager)
            return self._send(201, served(obj, res, version), res=res)
        if not name:
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested "
                           "resource", {})
        if sub == "scale":
            return self._scale(method, res, namespace, name, dry_run, manager)
        if method == "GET":
            return self._send(200, served(store.get(res, namespace, name), res, version), res=res)
        if method == "PUT":
            body = self._read_body() or {}
            obj = store.update(res, namespace, name, body, subresource=sub, dry_run=dry_run, manager=manager)
            return self._send(200, served(obj, res, version), res=res)
        if method == "PATCH":
            return self._patch(res, version, namespace, name, sub, dry_run, manager)
        if method == "DELETE":
            options = self._delete_options(query)
            out, gone = store.delete(res, namespace, name, options, dry_run=dry_run)
            # the real server's 202: not gone yet, and cascading deletion asked with orphanDependents: false
            code = 202 if not gone and options.get("orphanDependents") is False else 200
            return self._send(code, out if gone else served(out, res, version), res=None if gone else res)
        raise ApiError(405, "MethodNotAllowed", "method not allowed", {})

    @staticmethod
    def _dry_run(method, query):
        """?dryRun=All: validated and answered as the write would be, nothing stored."""
        if "dryRun" not in query or method == "GET":
            return False
        if query["dryRun"] != "All":
            kind = {"POST": "CreateOptions", "PUT": "UpdateOptions", "PATCH": "PatchOptions",
                    "DELETE": "DeleteOptions"}[method]
            why = f'Unsupported value: ["{query["dryRun"]}"]: supported values: "All"'
            raise ApiError(422, "Invalid", f'{kind}.meta.k8s.io "" is invalid: dryRun: {why}',
                           {"group": "meta.k8s.io", "kind": kind,
                            "causes": [{"reason": "FieldValueNotSupported", "message": why, "field": "dryRun"}]})
        return True

    def _delete_options(self, query):
        """DeleteOptions from the body (as client libraries send them) or the query string."""
        body = self._read_body() or {}
        if not isinstance(body, dict) or body.get("kind", "DeleteOptions") != "DeleteOptions":
            raise ApiError(400, "BadRequest", "the body of the request was not a DeleteOptions object")
        options = dict(body)
        if "propagationPolicy" in query:
            options["propagationPolicy"] = query["propagationPolicy"]
        if "orphanDependents" in query:
            options["orphanDependents"] = query["orphanDependents"] == "true"
        return options

    def _require_namespace(self, namespace):
        store = self.sim.store
        ns_res = store.resource("", "namespaces")
        with store.lock:
            if ("", namespace) not in store.objects[("", "namespaces")]:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found',
                               {"name": namespace, "kind": "namespaces"})
        return ns_res

    def _predicate(self, query):
        try:
            labels = parse_label_selector(query.get("labelSelector", ""))
            fields = parse_field_selector(query.get("fieldSelector", ""))
        except SelectorError as exc:
            raise ApiError(400, "BadRequest", str(exc))
        if not labels and not fields:
            return None, labels, fields
        return (lambda o: matches(labels, o.get("metadata", {}).get("labels")) and field_matches(fields, o)), \
            labels, fields

    def _list(self, res, version, namespace, query):
        pred = self._predicate(query)[0]
        try:
            limit = int(query.get("limit") or 0)
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid limit: {query.get('limit')}")
        items, meta = self.sim.store.list(res, namespace, limit=limit, token=query.get("continue"),
                                          rv_param=query.get("resourceVersion"), predicate=pred)
        body = {"apiVersion": res.api_version(version), "items": [served(o, res, version) for o in items],
                "kind": res.kind + "List", "metadata": meta}
        headers = {}
        if version != res.preferred and res.group.endswith("cluster.x-k8s.io"):
            headers["Warning"] = (f'299 - "{res.group}/{version} {res.kind} is deprecated; use '
                                  f'{res.group}/{res.preferred} {res.kind}"')
        self._send(200, body, headers=headers, res=res)

    def _patch(self, res, version, namespace, name, sub, dry_run=False, manager=None):
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype not in PATCH_TYPES and not (res.builtin and ctype == STRATEGIC):
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json-patch+json, "
                           "application/merge-patch+json, application/apply-patch+yaml"
                           + (", " + STRATEGIC if res.builtin else ""))
        body = self._read_body()
        store = self.sim.store
        with store.lock:
            current = store.get(res, namespace, name)
            try:
                if ctype in ("application/merge-patch+json", STRATEGIC):
                    if not isinstance(body, dict):
                        raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
                    patched = (strategic_merge_patch if ctype == STRATEGIC else merge_patch)(current, body)
                else:
                    patched = json_patch(current, body)
            except UnsupportedDirective as exc:
                raise ApiError(400, "BadRequest", str(exc))
            except JsonPatchError:
                raise ApiError(422, "Invalid", "the server rejected our request due to an error in our request",
                               {})
            precondition = ((body or {}).get("metadata") or {}).get("resourceVersion") \
                if isinstance(body, dict) else None
            patched.setdefault("metadata", {})
            patched["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if sub != "status" and "status" in res.subresources:
                if "status" in current:
                    patched["status"] = current["status"]
                else:
                    patched.pop("status", None)
            obj = store.update(res, namespace, name, patched, subresource=sub,
                               precondition_rv=precondition or current["metadata"]["resourceVersion"],
                               dry_run=dry_run, manager=manager)
        self._send(200, served(obj, res, version), res=res)

    @staticmethod
    def _scale_of(obj):
        """The autoscaling/v1 Scale of a custom resource, as kube-apiserver serves it (its specReplicasPath
        .spec.replicas, statusReplicasPath .status.replicas, labelSelectorPath .status.selector)."""
        meta, status = obj["metadata"], obj.get("status") or {}
        scale_status = {"replicas": status.get("replicas", 0)}
        if status.get("selector"):
            scale_status["selector"] = status["selector"]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                             if k in meta},
                # as a real server's autoscaling/v1 Scale: replicas omitted when 0 (omitempty)
                "spec": {k: v for k, v in {"replicas": (obj.get("spec") or {}).get("replicas", 0)}.items() if v},
                "status": scale_status}

    def _scale(self, method, res, namespace, name, dry_run=False, manager=None):
        """GET, PUT or PATCH (a merge patch or a JSON patch of the Scale: a custom resource takes no
        strategic merge patch) of /scale; only spec.replicas reaches the object."""
        store = self.sim.store
        with store.lock:
            obj = store.get(res, namespace, name)
            if method in ("PUT", "PATCH"):
                current = self._scale_of(obj)
                if method == "PATCH":
                    ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                    if ctype not in PATCH_TYPES:
                        raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                       "format - accepted media types include: application/json-patch+json, "
                                       "application/merge-patch+json, application/apply-patch+yaml")
                    body = self._read_body()
                    try:
                        if ctype == "application/merge-patch+json":
                            if not isinstance(body, dict):
                                raise ApiError(400, "BadRequest", "the body of the request must be a JSON object")
                            scale = merge_patch(current, body)
                        else:
                            scale = json_patch(current, body)
                    except JsonPatchError:
                        raise ApiError(422, "Invalid", "the server rejected our request due to an error in our "
                                       "request", {})
                else:
                    scale = self._read_body() or {}
                replicas = (scale.get("spec") or {}).get("replicas")
                if not isinstance(replicas, int) or isinstance(replicas, bool):
                    raise ApiError(422, "Invalid", f' "" is invalid: patch: Invalid value: json: cannot unmarshal '
                                   f"{type(replicas).__name__} into Go struct field ScaleSpec.spec.replicas of type "
                                   "int32", {"causes": [{"reason": "FieldValueInvalid", "field": "patch"}]})
                if replicas < 0:
                    why = f"Invalid value: {replicas}: should be a non-negative integer"
                    raise ApiError(422, "Invalid", f'{res.kind}.{res.group} "{name}" is invalid: .spec.replicas: '
                                   f"{why}", dict(_details(res, name, res.kind), causes=[
                                       {"reason": "FieldValueInvalid", "message": why, "field": ".spec.replicas"}]))
                precondition = (scale.get("metadata") or {}).get("resourceVersion") \
                    or obj["metadata"]["resourceVersion"]
                new = copy.deepcopy(obj)
                new.setdefault("spec", {})["replicas"] = replicas
                obj = store.update(res, namespace, name, new, precondition_rv=precondition,
                                   dry_run=dry_run, manager=manager, subresource="scale")
        self._send(200, self._scale_of(obj))

    # ---------------------------------------------------------------- watch
    def _chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _event(self, etype, obj, res, version):
        body = json.dumps(served(obj, res, version) if res else obj, separators=(",", ":"),
                          sort_keys=res is not None and not res.builtin)
        line = ('{"type":%s,"object":%s}' % (json.dumps(etype), body)).encode() + b"\n"
        self._chunk(line)

    def _watch(self, res, version, namespace, query):
        import time
        store = self.sim.store
        pred = self._predicate(query)[0]
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        rv_param = query.get("resourceVersion")

        def visible(obj):
            if obj is None:
                return False
            if namespace is not None and obj["metadata"].get("namespace") != namespace:
                return False
            return pred is None or pred(obj)

        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        try:
            if rv_param in (None, "", "0"):
                items, meta = store.list(res, namespace, predicate=pred, rv_param="0")
                for obj in items:
                    self._event("ADDED", obj, res, version)
                rv = int(meta["resourceVersion"])
            else:
                rv = int(rv_param)
            while time.monotonic() < deadline:
                try:
                    events = store.events_since(rv)
                except ApiError as err:
                    self._event("ERROR", err.status(), None, version)
                    break
                for erv, group, plural, etype, old, new in events:
                    rv = erv
                    if (group, plural) != (res.group, res.plural):
                        continue
                    was, now_ = visible(old), visible(new)
                    if etype == "DELETED":
                        if was:
                            self._event("DELETED", new, res, version)
                    elif was and now_:
                        self._event("MODIFIED", new, res, version)
                    elif now_:
                        self._event("ADDED", new, res, version)
                    elif was:
                        self._event("DELETED", old, res, version)
                with store.lock:
                    if store.rv <= rv:
                        store.changed.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True

    # ---------------------------------------------------------------- admin
    def _admin(self, method, path, who):
        """Simulator controls (not part of the Kubernetes API): admin token only."""
        if who.rules is not None:
            raise ApiError(403, "Forbidden", "only the admin may use /_sim", {})
        if method == "POST" and path == "/_sim/compact":
            self.sim.store.compact()
            return self._send(200, {"compacted": True, "resourceVersion": str(self.sim.store.rv)})
        return self._not_found_text()
