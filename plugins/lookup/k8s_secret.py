# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One Secret of the management cluster, read in the controller's own process."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: k8s_secret
short_description: Read one Secret of the management cluster
version_added: 0.1.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Returns the Secret as the Kubernetes API does (C(metadata), C(type), C(data) base64-encoded), or an empty
    mapping when it does not exist.
  - One GET through the same client as the C(converged.hpc.capi_machines) inventory, with the credentials
    kubernetes.core would use (the options below, then C(K8S_AUTH_*), C($KUBECONFIG), C(~/.kube/config), or the
    in-cluster service account). It runs in the controller's process, so it costs one request (about 0.05 s)
    where a C(kubernetes.core.k8s_info) task costs a module run (about 1.2 s).
  - The result holds the Secret's data. Use it in a task with C(no_log), and keep it out of output. An error
    names the Secret and the reason, never a credential.
options:
  _terms:
    description: The Secret's name.
    required: true
  namespace:
    description: Its namespace.
    type: str
    default: default
  kubeconfig:
    description: The kubeconfig to reach it (empty - as kubernetes.core finds one, C(K8S_AUTH_*) included).
    type: str
    default: ""
  context:
    description: The kubeconfig context (empty - the current one).
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Read the munge key Secret
  ansible.builtin.set_fact:
    munge_secret: "{{ lookup('converged.hpc.k8s_secret', 'hpc-munge-key', namespace='hpc') }}"
  no_log: true
"""

RETURN = r"""
_raw:
  description: The Secret (a mapping), or an empty mapping when it does not exist.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

try:
    from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (
        CapiApiError,
        read_secret,
    )
except ImportError:  # pragma: no cover - the module_utils ship with this plugin
    read_secret = None


OPTIONS = {"namespace": "default", "kubeconfig": "", "context": ""}


class LookupModule(LookupBase):

    def run(self, terms, variables=None, **kwargs):
        unknown = sorted(set(kwargs) - set(OPTIONS))
        if unknown:
            raise AnsibleLookupError("k8s_secret has no option %s (it takes %s)" % (", ".join(unknown), ", ".join(OPTIONS)))
        options = dict(OPTIONS, **{k: v for k, v in kwargs.items() if v is not None})
        for key, value in options.items():
            if not isinstance(value, str):
                raise AnsibleLookupError("k8s_secret: %s must be a string, got %r" % (key, value))
        if len(terms) != 1 or not isinstance(terms[0], str) or not terms[0]:
            raise AnsibleLookupError("k8s_secret takes one Secret name, got %r" % (terms,))
        name, namespace = terms[0], options["namespace"] or "default"
        try:
            secret = read_secret(name, namespace, options["kubeconfig"], options["context"])
        except CapiApiError as exc:
            raise AnsibleLookupError("cannot read Secret %s/%s: %s" % (namespace, name, exc))
        return [secret or {}]
