# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read Cluster API and Metal3 objects from a management cluster.

API access only: client construction from the usual kubernetes.core options
(kubeconfig, context, host, api_key, certificates, K8S_AUTH_* variables),
preferred-version discovery and paginated bulk lists. Lists go through the
client's configured connection pool as plain HTTP + json, the fastest path
measured on a real kube-apiserver (the DynamicClient wraps every item and
costs about 40 % more). Every failure becomes one CapiApiError whose message
says what failed and where.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
from urllib.parse import urlencode

try:
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised only without the library
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc

CAPI_GROUP = "cluster.x-k8s.io"
INFRA_GROUP = "infrastructure.cluster.x-k8s.io"
METAL3_GROUP = "metal3.io"


class CapiApiError(Exception):
    """One clear line on what failed and where."""


def _status_message(body):
    try:
        data = json.loads(body)
        return data.get("message") or data.get("reason") or body
    except (ValueError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        return text.strip()


def build_configuration(kubeconfig=None, context=None, host=None, api_key=None, validate_certs=None,
                        ca_cert=None, client_cert=None, client_key=None, proxy=None):
    """A kubernetes.client.Configuration from kubernetes.core-style options.

    Order: an explicit host (with api_key or client certificates), else a
    kubeconfig (the given path, $KUBECONFIG or ~/.kube/config), else the
    in-cluster service account (AWX running inside Kubernetes).
    """
    if not HAS_KUBERNETES:
        raise CapiApiError("the Python 'kubernetes' library is required on the control node "
                           "(pip install kubernetes): %s" % KUBERNETES_IMPORT_ERROR)
    configuration = k8s_client.Configuration()
    if host is None:
        path = kubeconfig or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        path = os.path.expanduser(path.split(os.pathsep)[0])
        if os.path.exists(path):
            try:
                k8s_config.load_kube_config(config_file=path, context=context,
                                            client_configuration=configuration, persist_config=False)
            except (ConfigException, ValueError, TypeError, KeyError) as exc:
                raise CapiApiError("cannot use kubeconfig %s%s: %s" % (
                    path, " (context %s)" % context if context else "", str(exc).splitlines()[0]))
            except Exception as exc:  # yaml errors and the like
                raise CapiApiError("cannot read kubeconfig %s: %s" % (path, str(exc).splitlines()[0]))
        elif kubeconfig:
            raise CapiApiError("kubeconfig %s does not exist" % kubeconfig)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except ConfigException as exc:
                raise CapiApiError("cannot use the in-cluster service account: %s" % exc)
        else:
            raise CapiApiError("no Kubernetes API to talk to: set host (K8S_AUTH_HOST) or kubeconfig "
                               "(K8S_AUTH_KUBECONFIG), or provide ~/.kube/config")
    else:
        configuration.host = host.rstrip("/")
    if api_key:
        configuration.api_key = {"authorization": "Bearer %s" % api_key}
    if validate_certs is not None:
        configuration.verify_ssl = bool(validate_certs)
    if ca_cert:
        configuration.ssl_ca_cert = ca_cert
    if client_cert:
        configuration.cert_file = client_cert
    if client_key:
        configuration.key_file = client_key
    if proxy:
        configuration.proxy = proxy
    for path in (configuration.ssl_ca_cert if ca_cert else None, client_cert, client_key):
        if path and not os.path.exists(path):
            raise CapiApiError("certificate file %s does not exist" % path)
    return configuration


class CapiReader:
    """Discovery and paginated lists over one connection pool."""

    def __init__(self, configuration, page_size=500, timeout=60):
        self.configuration = configuration
        self.host = configuration.host
        self.page_size = page_size
        self.timeout = timeout
        try:
            self.api_client = k8s_client.ApiClient(configuration)
        except Exception as exc:  # bad certificate files and the like
            raise CapiApiError("cannot set up a client for %s: %s" % (self.host, exc))
        self.pool = self.api_client.rest_client.pool_manager
        self.requests = 0

    def close(self):
        try:
            self.api_client.close()
        except Exception:  # pragma: no cover - best effort
            pass

    def _headers(self):
        headers = {"Accept": "application/json", "User-Agent": "converged.hpc/capi_machines"}
        for setting in self.configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    def request(self, path, query=None):
        """GET path; return (status, body bytes). Connection failures raise CapiApiError."""
        url = self.host + path + ("?" + urlencode(query) if query else "")
        self.requests += 1
        try:
            resp = self.pool.request("GET", url, headers=self._headers(), preload_content=True,
                                     timeout=self.timeout, retries=False)
        except Exception as exc:  # urllib3 errors: refused, DNS, TLS, timeout
            reason = getattr(exc, "reason", None) or exc
            raise CapiApiError("cannot reach the Kubernetes API at %s: %s" % (self.host, reason))
        return resp.status, resp.data

    def _fail(self, status, body, what):
        message = _status_message(body)
        if status == 401:
            raise CapiApiError("the Kubernetes API at %s rejected the credentials (401 Unauthorized) while "
                               "listing %s: check the token, client certificate or kubeconfig" % (self.host, what))
        if status == 403:
            raise CapiApiError("the Kubernetes API at %s refused to list %s (403 Forbidden): %s"
                               % (self.host, what, message))
        raise CapiApiError("listing %s at %s failed with HTTP %s: %s" % (what, self.host, status, message))

    def preferred_version(self, group):
        """The group's preferred version from discovery, or None when the group is not served."""
        status, body = self.request("/apis/%s" % group)
        if status == 404:
            return None
        if status != 200:
            self._fail(status, body, "API group %s" % group)
        try:
            return json.loads(body)["preferredVersion"]["version"]
        except (ValueError, KeyError, TypeError):
            raise CapiApiError("the Kubernetes API at %s answered discovery of %s with something that is not "
                               "an APIGroup" % (self.host, group))

    def list(self, group, version, plural, namespace=None, label_selector=None, restarts=2):
        """All items of a kind, page by page; an expired continue token restarts the list (410)."""
        base = "/apis/%s/%s" % (group, version)
        path = "%s/namespaces/%s/%s" % (base, namespace, plural) if namespace else "%s/%s" % (base, plural)
        what = "%s.%s%s" % (plural, group, " in namespace %s" % namespace if namespace else "")
        items, token, pages = [], None, 0
        while True:
            query = {"limit": self.page_size}
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            status, body = self.request(path, query)
            if status == 410 and token and restarts > 0:
                # the snapshot behind the token is gone: start a consistent list again
                restarts -= 1
                items, token = [], None
                continue
            if status == 404 and namespace:
                return []  # a namespace that does not exist holds nothing
            if status != 200:
                self._fail(status, body, what)
            try:
                data = json.loads(body)
            except ValueError:
                raise CapiApiError("listing %s at %s returned something that is not JSON" % (what, self.host))
            items.extend(data.get("items") or [])
            pages += 1
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return items
