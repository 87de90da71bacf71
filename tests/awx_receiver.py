"""AWX's webhook receivers, as AWX 24.6.1 behaves (../shared/testbed/NOTES.md): the one part of AWX
the collection talks to without an AWX user, for the webhook sender's and the rulebook's tests.

POST /api/v2/job_templates/<id>/github/  X-Hub-Signature: sha1=<HMAC-SHA1 of the body> (anything else 403),
                                         delivery id X-GitHub-Delivery
POST /api/v2/job_templates/<id>/gitlab/  X-Gitlab-Token: <key> (else 403), delivery id = SHA-1 of the body
A template with another webhook service answers 405, an unknown template 404. A delivery already
seen answers 202 "Webhook previously received, aborting." and starts nothing; a new one 202
"Job queued." and becomes a job: extra vars awx_webhook_payload (the parsed body),
awx_webhook_event_type, awx_webhook_event_guid. `on_job(template, extra_vars)` is called for each
(the ansible-runner tests run the template's playbook there, as AWX's job side would)."""

import hashlib
import hmac
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

QUEUED = "Job queued."
SEEN = "Webhook previously received, aborting."


class Receiver:
    def __init__(self, templates, on_job=None):
        """templates: {id: {"service": "github"|"gitlab", "key": str}}."""
        self.templates = templates
        self.on_job = on_job
        self.jobs = []          # (template id, extra vars)
        self.answers = []       # (status, message)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                status, message = receiver.receive(self.path, self.headers, body)
                with receiver.lock:
                    receiver.answers.append((status, message))
                data = json.dumps({"message" if status == 202 else "detail": message}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def webhook_url(self, template):
        return "%s/api/v2/job_templates/%s/%s/" % (self.url, template, self.templates[template]["service"])

    def receive(self, path, headers, body):
        match = re.fullmatch(r"/api/v2/job_templates/(\d+)/(github|gitlab)/", path)
        if not match or int(match.group(1)) not in self.templates:
            return 404, "Not found."
        template, service = int(match.group(1)), match.group(2)
        spec = self.templates[template]
        if spec["service"] != service:
            return 405, "Method \"POST\" not allowed."
        forbidden = (403, "You do not have permission to perform this action.")
        if service == "github":
            sig = headers.get("X-Hub-Signature") or ""
            alg, _sep, digest = sig.partition("=")
            good = hmac.new(spec["key"].encode(), msg=body, digestmod=hashlib.sha1).hexdigest()
            if alg != "sha1" or not hmac.compare_digest(good.encode(), digest.encode()):
                return forbidden
            guid, event = headers.get("X-GitHub-Delivery"), headers.get("X-GitHub-Event")
        else:
            if not hmac.compare_digest(spec["key"].encode(), (headers.get("X-Gitlab-Token") or "").encode()):
                return forbidden
            guid, event = hashlib.sha1(body).hexdigest(), headers.get("X-Gitlab-Event")
        with self.lock:
            if any(t == template and v["awx_webhook_event_guid"] == guid for t, v in self.jobs):
                return 202, SEEN
            extra_vars = {"awx_webhook_payload": json.loads(body or b"{}"), "awx_webhook_event_type": event,
                          "awx_webhook_event_guid": guid}
            self.jobs.append((template, extra_vars))
        if self.on_job:
            self.on_job(template, extra_vars)
        return 202, QUEUED

    def stop(self):
        self.server.shutdown()
        self.server.server_close()
