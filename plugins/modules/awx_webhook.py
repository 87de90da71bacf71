#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: awx_webhook
short_description: Launch an AWX job template through its GitHub- or GitLab-style webhook
version_added: 0.2.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Sends O(payload) to a job template's webhook URL (C(/api/v2/job_templates/<id>/github/) or C(/gitlab/)), the way
    AWX accepts webhooks - the only launch that needs no AWX user, just the template's webhook key. The job gets the
    payload as the extra variable C(awx_webhook_payload).
  - C(github) signs the exact bytes sent with HMAC-SHA1 of the webhook key (header C(X-Hub-Signature), the only
    algorithm AWX accepts there) and names the delivery (C(X-GitHub-Delivery)) after a hash of the body.
    C(gitlab) sends the key itself as C(X-Gitlab-Token).
  - AWX starts one job per delivery and drops a delivery it has already seen (GitHub - the same C(X-GitHub-Delivery);
    GitLab - the same body). The body is serialised canonically (sorted keys), so the same payload is the same
    delivery; make each event's payload unique (the C(converged.hpc.capi_machines) events carry the Machines'
    resourceVersions and a timestamp) and a retried delivery never starts a second job.
  - Reported changed when AWX queued a job, unchanged when it dropped the delivery as already seen. Fails on any
    other answer, naming it (403 - the key or the service does not match the template's).
options:
  url:
    description:
      - The job template's webhook URL, as C(converged.hpc) C(playbooks/awx_configure.yml) prints it, for example
        C(https://awx.example.org/api/v2/job_templates/12/github/). Its last path element must match O(service).
    type: str
    required: true
  service:
    description: The job template's C(webhook_service).
    type: str
    choices: [github, gitlab]
    required: true
  key:
    description: The job template's webhook key (C(GET /api/v2/job_templates/<id>/webhook_key/)). Never logged.
    type: str
    required: true
  payload:
    description: The body (a mapping). Reaches the job as C(awx_webhook_payload).
    type: dict
    required: true
  event:
    description: The event type sent as C(X-GitHub-Event) or C(X-Gitlab-Event) (reaches the job as C(awx_webhook_event_type)).
    type: str
    default: converged-hpc-machines
  validate_certs:
    description: Verify AWX's certificate.
    type: bool
    default: true
  ca_path:
    description: CA bundle to verify AWX's certificate with.
    type: path
  timeout:
    description: Seconds to wait for AWX's answer.
    type: int
    default: 30
notes:
  - Check mode sends nothing and reports what would be sent (without the key).
"""

EXAMPLES = r"""
- name: Start the reconcile job template for a burst of Machine events
  converged.hpc.awx_webhook:
    url: https://awx.example.org/api/v2/job_templates/12/github/
    service: github
    key: "{{ vault_reconcile_webhook_key }}"
    payload: "{{ ansible_eda.event.capi_machines }}"
"""

RETURN = r"""
status:
  description: AWX's HTTP status (202 when it took the delivery).
  returned: when sent
  type: int
message:
  description: AWX's answer (C(Job queued.), or C(Webhook previously received, aborting.)).
  returned: when sent
  type: str
delivery:
  description: The delivery's identity as AWX keys it (SHA-1 of the body).
  returned: always
  type: str
"""

import hashlib
import hmac
import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError

QUEUED = "Job queued."


def body_of(payload):
    """The exact bytes sent and signed: canonical JSON, so one payload is one delivery."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode("utf-8")


def headers_for(service, key, body, event):
    """AWX's webhook headers: GitHub - HMAC-SHA1 signature and a delivery id; GitLab - the token."""
    headers = {"Content-Type": "application/json"}
    delivery = hashlib.sha1(body).hexdigest()
    if service == "github":
        mac = hmac.new(key.encode("utf-8"), msg=body, digestmod=hashlib.sha1).hexdigest()
        headers.update({"X-Hub-Signature": "sha1=%s" % mac, "X-GitHub-Event": event, "X-GitHub-Delivery": delivery})
    else:
        headers.update({"X-Gitlab-Token": key, "X-Gitlab-Event": event})
    return headers, delivery


def refusal(status, url, service):
    if status == 403:
        return ("AWX refused the webhook at %s (403): the key is not this job template's webhook key, or the "
                "template's webhook service is not %s" % (url, service))
    if status == 404:
        return ("AWX has no %s webhook at %s (404): check the job template's id and that its webhook service is %s"
                % (service, url, service))
    if status == 405:
        return "AWX does not take a %s webhook at %s (405): the template's webhook service is not %s" % (
            service, url, service)
    return "AWX answered %s to the webhook at %s" % (status, url)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            service=dict(type="str", required=True, choices=["github", "gitlab"]),
            key=dict(type="str", required=True, no_log=True),
            payload=dict(type="dict", required=True),
            event=dict(type="str", default="converged-hpc-machines"),
            validate_certs=dict(type="bool", default=True),
            ca_path=dict(type="path"),
            timeout=dict(type="int", default=30),
        ),
        supports_check_mode=True,
    )
    url, service, key = module.params["url"], module.params["service"], module.params["key"]
    if not url.rstrip("/").endswith("/" + service):
        module.fail_json(msg="url %s is not a %s webhook URL (it ends in /%s/)" % (url, service, service))
    if not key.strip():
        module.fail_json(msg="key is empty: give the job template's webhook key")
    body = body_of(module.params["payload"])
    headers, delivery = headers_for(service, key, body, module.params["event"])
    if module.check_mode:
        module.exit_json(changed=True, delivery=delivery, msg="would send %d bytes to %s" % (len(body), url))
    try:
        resp = open_url(url, data=body, headers=headers, method="POST", validate_certs=module.params["validate_certs"],
                        ca_path=module.params["ca_path"], timeout=module.params["timeout"])
        status, text = resp.getcode(), resp.read().decode("utf-8", "replace")
    except HTTPError as exc:
        module.fail_json(msg=refusal(exc.code, url, service), status=exc.code, delivery=delivery)
    except (URLError, OSError) as exc:
        module.fail_json(msg="cannot reach AWX at %s: %s" % (url, getattr(exc, "reason", exc)), delivery=delivery)
    try:
        message = json.loads(text).get("message", text)
    except (ValueError, AttributeError):
        message = text
    if status != 202:
        module.fail_json(msg=refusal(status, url, service), status=status, delivery=delivery)
    module.exit_json(changed=(message == QUEUED), status=status, message=message, delivery=delivery)


if __name__ == "__main__":
    main()
