"""A stand-in for AWX 24.6.1's REST API, as far as awx_configure.yml's awx.awx modules use it: AWX itself
cannot be installed here (../shared/testbed/NOTES.md). It is not AWX; it keeps what decides whether a
configuration-as-code run changes something:

- objects by endpoint, looked up by name and by the other fields a module filters on (organization,
  kind, inventory, unified_job_template, or__id/or__name), created with POST, changed with PATCH
  (only the fields sent), deleted with DELETE; related lists (a job template's credentials) associated
  and disassociated with POST {id[, disassociate]} answering 204;
- credentials as AWX keeps their inputs (awx/main/models/credential): a secret field of the credential
  type is shown as "$encrypted$" and kept when "$encrypted$" is sent back, and an empty secret is not
  stored at all; the managed types Machine and "OpenShift or Kubernetes API Bearer Token" with AWX's
  own field definitions;
- a project's update, started when it is created, successful at once;
- X-API-Product-Name/Version headers, a bearer token, and every write kept in `writes`.

`secret(credential_name, field)` reads a stored secret back, as a job would get it injected.
"""

import copy
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

ENCRYPTED = "$encrypted$"
MANAGED_TYPES = [
    {"name": "Machine", "kind": "ssh", "namespace": "ssh", "managed": True, "inputs": {"fields": [
        {"id": "username", "label": "Username", "type": "string"},
        {"id": "password", "label": "Password", "type": "string", "secret": True, "ask_at_runtime": True},
        {"id": "ssh_key_data", "label": "SSH Private Key", "type": "string", "format": "ssh_private_key",
         "secret": True, "multiline": True},
        {"id": "ssh_public_key_data", "label": "Signed SSH Certificate", "type": "string", "multiline": True,
         "secret": True},
        {"id": "ssh_key_unlock", "label": "Private Key Passphrase", "type": "string", "secret": True,
         "ask_at_runtime": True},
        {"id": "become_method", "label": "Privilege Escalation Method", "type": "string"},
        {"id": "become_username", "label": "Privilege Escalation Username", "type": "string"},
        {"id": "become_password", "label": "Privilege Escalation Password", "type": "string", "secret": True,
         "ask_at_runtime": True}]}, "injectors": {}},
    {"name": "OpenShift or Kubernetes API Bearer Token", "kind": "kubernetes", "namespace": "kubernetes_bearer_token",
     "managed": True, "inputs": {"fields": [
         {"id": "host", "label": "OpenShift or Kubernetes API Endpoint", "type": "string"},
         {"id": "bearer_token", "label": "API authentication bearer token", "type": "string", "secret": True},
         {"id": "verify_ssl", "label": "Verify SSL", "type": "boolean", "default": True},
         {"id": "ssl_ca_cert", "label": "Certificate Authority data", "type": "string", "secret": True,
          "multiline": True}],
         "required": ["host", "bearer_token"]}, "injectors": {}},
]
# endpoint -> the type AWX names its objects by
TYPES = {"organizations": "organization", "credential_types": "credential_type", "credentials": "credential",
         "projects": "project", "inventories": "inventory", "inventory_sources": "inventory_source",
         "job_templates": "job_template", "schedules": "schedule", "execution_environments": "execution_environment",
         "project_updates": "project_update", "labels": "label", "instance_groups": "instance_group",
         "notification_templates": "notification_template", "users": "user", "teams": "team"}
UNIFIED = ("job_templates", "projects", "inventory_sources")


class AwxApi:
    def __init__(self, token):
        self.token = token
        self.objects = {endpoint: {} for endpoint in TYPES}
        self.related = {}          # (endpoint, id, name) -> [ids]
        self.raw_inputs = {}       # credential id -> inputs as given (secrets in clear)
        self.writes = []           # (method, path, body)
        self.requests = []         # (method, path) of every request
        self.webhook_keys = {}
        self.lock = threading.Lock()
        self.next_id = 1
        self._make("organizations", {"name": "Default"})
        for kind in MANAGED_TYPES:
            self._make("credential_types", copy.deepcopy(kind))
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body=None):
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("X-API-Product-Name", "AWX")
                self.send_header("X-API-Product-Version", "24.6.1")
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.headers.get("Authorization") != "Bearer " + api.token:
                    return self._answer(401, {"detail": "Authentication credentials were not provided."})
                body = json.loads(raw) if raw else None
                url = urlsplit(self.path)
                with api.lock:
                    api.requests.append((method, url.path))
                    status, out = api.handle(method, url.path, dict(parse_qsl(url.query)), body)
                self._answer(status, out)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

            def do_PATCH(self):
                self._handle("PATCH")

            def do_DELETE(self):
                self._handle("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    # ---- what a test reads
    def named(self, endpoint, name):
        found = [o for o in self.objects[endpoint].values() if o.get("name") == name]
        return copy.deepcopy(found[0]) if found else None

    def secret(self, credential, field):
        return self.raw_inputs[self.named("credentials", credential)["id"]].get(field)

    def associated(self, endpoint, name, relation):
        ids = self.related.get((endpoint, self.named(endpoint, name)["id"], relation), [])
        return sorted(self.objects["credentials"][i]["name"] for i in ids)

    # ---- the API
    def _make(self, endpoint, fields):
        obj = dict(fields, id=self.next_id, type=TYPES[endpoint])
        self.next_id += 1
        obj["url"] = "/api/v2/%s/%d/" % (endpoint, obj["id"])
        obj["related"] = {}
        obj["summary_fields"] = {}
        self.objects[endpoint][obj["id"]] = obj
        return obj

    def _secret_fields(self, type_id):
        kind = self.objects["credential_types"].get(type_id) or {}
        return {f["id"] for f in (kind.get("inputs") or {}).get("fields", []) if f.get("secret")}

    def _store_inputs(self, obj, given, keep):
        """AWX's Credential.save/encrypt_field: $encrypted$ keeps the stored value, an empty secret is dropped."""
        secrets = self._secret_fields(obj.get("credential_type"))
        raw = {}
        for key, value in (given or {}).items():
            if value == ENCRYPTED and key in keep:
                value = keep[key]
            if key in secrets and value in ("", None):
                continue
            raw[key] = value
        self.raw_inputs[obj["id"]] = raw
        obj["inputs"] = {k: (ENCRYPTED if k in secrets else v) for k, v in raw.items()}

    def handle(self, method, path, query, body):
        parts = [p for p in path.split("/") if p]
        if parts[:2] != ["api", "v2"] or len(parts) < 3:
            return 404, {"detail": "Not found."}
        endpoint, rest = parts[2], parts[3:]
        if endpoint == "ping":
            return 200, {"version": "24.6.1"}
        if endpoint == "unified_job_templates" and method == "GET":
            found = [o for e in UNIFIED for o in self.objects[e].values() if self._matches(o, query)]
            return 200, {"count": len(found), "results": copy.deepcopy(found)}
        if endpoint not in self.objects:
            return 404, {"detail": "Not found."}
        table = self.objects[endpoint]
        if not rest:
            if method == "GET":
                found = [o for o in table.values() if self._matches(o, query)]
                return 200, {"count": len(found), "next": None, "previous": None, "results": copy.deepcopy(found)}
            if method == "POST":
                self.writes.append((method, path, body))
                return self._create(endpoint, body or {})
            return 405, {"detail": 'Method "%s" not allowed.' % method}
        if not re.match(r"^\d+$", rest[0]) or int(rest[0]) not in table:
            return 404, {"detail": "Not found."}
        obj = table[int(rest[0])]
        if len(rest) == 1:
            if method == "GET":
                return 200, copy.deepcopy(obj)
            if method == "PATCH":
                self.writes.append((method, path, body))
                return self._update(endpoint, obj, body or {})
            if method == "DELETE":
                self.writes.append((method, path, body))
                del table[obj["id"]]
                return 204, None
        relation = rest[1]
        if relation == "webhook_key" and endpoint == "job_templates" and method == "GET":
            return 200, {"webhook_key": self.webhook_keys.get(obj["id"], "")}
        key = (endpoint, obj["id"], relation)
        if method == "GET":
            ids = self.related.get(key, [])
            target = {"credentials": "credentials"}.get(relation)
            results = [copy.deepcopy(self.objects[target][i]) for i in ids] if target else []
            return 200, {"count": len(results), "next": None, "previous": None, "results": results}
        if method == "POST":
            self.writes.append((method, path, body))
            ids = self.related.setdefault(key, [])
            if body.get("disassociate"):
                if body["id"] in ids:
                    ids.remove(body["id"])
            elif body["id"] not in ids:
                ids.append(body["id"])
            return 204, None
        return 405, {"detail": 'Method "%s" not allowed.' % method}

    @staticmethod
    def _matches(obj, query):
        for key, value in query.items():
            if key in ("page_size", "page", "order_by"):
                continue
            if key.startswith("or__"):
                continue  # with or__id, the name decides below
            if str(obj.get(key)) != str(value):
                return False
        ors = [(k[4:], v) for k, v in query.items() if k.startswith("or__")]
        return not ors or any(str(obj.get(k)) == str(v) for k, v in ors)

    def _create(self, endpoint, body):
        name = body.get("name")
        scope = {k: body.get(k) for k in ("organization", "inventory", "credential_type", "kind", "unified_job_template")
                 if k in body}
        if name and any(o.get("name") == name and all(o.get(k) == v for k, v in scope.items())
                        for o in self.objects[endpoint].values()):
            return 400, {"__all__": ["%s with this Name already exists." % TYPES[endpoint]]}
        fields = {k: v for k, v in body.items() if k != "inputs" or endpoint != "credentials"}
        obj = self._make(endpoint, fields)
        if endpoint == "credentials":
            self._store_inputs(obj, body.get("inputs") or {}, {})
        if endpoint == "projects":
            update = self._make("project_updates", {"name": name, "status": "successful", "failed": False,
                                                    "finished": "2026-01-01T00:00:00Z"})
            obj.update(scm_revision="0" * 40, status="successful")
            obj["summary_fields"]["current_update"] = {"id": update["id"], "status": "successful"}
            obj["related"]["update"] = obj["url"] + "update/"
        if endpoint == "job_templates":
            self.webhook_keys[obj["id"]] = "key-%d" % obj["id"] if body.get("webhook_service") else ""
        return 201, copy.deepcopy(obj)

    def _update(self, endpoint, obj, body):
        for key, value in body.items():
            if key == "inputs" and endpoint == "credentials":
                self._store_inputs(obj, value, self.raw_inputs.get(obj["id"], {}))
            else:
                obj[key] = value
        if endpoint == "job_templates" and "webhook_service" in body:
            self.webhook_keys[obj["id"]] = "key-%d" % obj["id"] if body["webhook_service"] else ""
        return 200, copy.deepcopy(obj)


def inject(credential_type, inputs, env_dir):
    """What AWX 24.6.1 gives a job for a credential of a custom type (CredentialType.inject_credential):
    the inputs set (non-empty) are the template namespace, each extra_vars injector is rendered in
    Jinja's immutable sandbox, and the result is written as YAML to a file of env_dir the job gets as
    `-e @file`. Returns that file's path, or None when the type injects no extra vars."""
    import os
    import tempfile

    import yaml
    from jinja2 import sandbox

    namespace = {k: v for k, v in inputs.items() if isinstance(v, bool) or len(v)}
    env = sandbox.ImmutableSandboxedEnvironment()
    extra_vars = {name: env.from_string(template).render(**namespace)
                  for name, template in (credential_type.get("injectors") or {}).get("extra_vars", {}).items()}
    if not extra_vars:
        return None
    handle, path = tempfile.mkstemp(dir=env_dir)
    with os.fdopen(handle, "w") as fh:
        fh.write(yaml.safe_dump(extra_vars))
    os.chmod(path, 0o440)
    return path
