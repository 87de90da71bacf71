# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Connection options for the management cluster's Kubernetes API."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - Path to a kubeconfig file. Defaults to C($KUBECONFIG), then C(~/.kube/config), then the in-cluster
        service account when running inside Kubernetes (AWX).
    type: path
    env:
      - name: K8S_AUTH_KUBECONFIG
  context:
    description: The kubeconfig context to use.
    type: str
    env:
      - name: K8S_AUTH_CONTEXT
  host:
    description: URL of the Kubernetes API server; when set, the kubeconfig is not read.
    type: str
    env:
      - name: K8S_AUTH_HOST
  api_key:
    description: Bearer token for the API server. Never printed.
    type: str
    env:
      - name: K8S_AUTH_API_KEY
  validate_certs:
    description: Verify the API server's TLS certificate.
    type: bool
    aliases: [verify_ssl]
    env:
      - name: K8S_AUTH_VERIFY_SSL
  ca_cert:
    description: CA certificate that signed the API server's certificate.
    type: path
    aliases: [ssl_ca_cert]
    env:
      - name: K8S_AUTH_SSL_CA_CERT
  client_cert:
    description: Client certificate for certificate authentication.
    type: path
    aliases: [cert_file]
    env:
      - name: K8S_AUTH_CERT_FILE
  client_key:
    description: Key of the client certificate.
    type: path
    aliases: [key_file]
    env:
      - name: K8S_AUTH_KEY_FILE
  proxy:
    description: HTTP proxy URL to reach the API server.
    type: str
    env:
      - name: K8S_AUTH_PROXY
"""
