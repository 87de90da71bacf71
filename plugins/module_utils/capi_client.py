# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read Cluster API and Metal3 objects from a management cluster.

API access only. The client configuration is kubernetes.core's own (the same
options and K8S_AUTH_* variables as its modules: kubeconfig as a path, several
paths or a dict, context, host, api_key, certificates, proxy and no_proxy,
impersonation, in-cluster), and on top of it the measured fast path:
preferred-version discovery and paginated bulk lists through that client's
connection pool as plain HTTP + json (the DynamicClient wraps every item and
costs about 40 % more). Every failure becomes one CapiApiError whose message says
what failed and where, and never holds a credential.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote, urlencode

try:
    from urllib3 import HTTPHeaderDict
except ImportError:  # pragma: no cover - urllib3 < 2, or no urllib3 (then no kubernetes either)
    try:
        from urllib3._collections import HTTPHeaderDict
    except ImportError:
        HTTPHeaderDict = dict

try:
    import urllib3
    from kubernetes import client as k8s_client
    from kubernetes import config as k8s_config
    from kubernetes.config.config_exception import ConfigException

    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - exercised only without the library
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = exc

try:
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_MAP
    from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import (
        _create_auth_spec,
        _create_headers,
    )

    HAS_K8S_CORE = True
except ImportError:  # pragma: no cover - kubernetes.core comes with the ansible package
    HAS_K8S_CORE = False

CAPI_GROUP = "cluster.x-k8s.io"
INFRA_GROUP = "infrastructure.cluster.x-k8s.io"
METAL3_GROUP = "metal3.io"
AUTH_OPTIONS = ("kubeconfig", "context", "host", "api_key", "username", "password", "validate_certs", "ca_cert",
                "client_cert", "client_key", "proxy", "no_proxy", "proxy_headers", "persist_config",
                "impersonate_user", "impersonate_groups")
_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)
_LIST_META = b'"metadata":'


def continue_token(body):
    """The continue token of a list page, read from its end without decoding the page.

    A kube-apiserver writes a list's keys sorted (apiVersion, items, kind, metadata), so the
    ListMeta is the last value of the body. None when it is not there or has no token: the
    caller then waits for the decoded page, as without a look-ahead."""
    tail = body[-2048:]
    at = tail.rfind(_LIST_META)
    if at < 0:
        return None
    rest = tail[at + len(_LIST_META):].rstrip()
    if not rest.endswith(b"}"):
        return None
    try:
        meta = json.loads(rest[:-1])
    except ValueError:
        return None
    token = meta.get("continue") if isinstance(meta, dict) else None
    return token if isinstance(token, str) and token else None


_MANAGED_FIELDS = b'"managedFields":['
# the end of the array: its last entry's last key is "time" (UTC), and "name" is the next key of the metadata
_MANAGED_FIELDS_END = b'Z"}],"name":"'
_CUT_TO = len(b'Z"}],')


def without_managed_fields(body):
    """A list page with each object's metadata.managedFields cut out before it is decoded.

    They are about half of a real response's bytes, and more of its decoding (many small
    mappings), and no reader here uses them. A kube-apiserver writes a custom resource's keys
    sorted, at every level: the array is followed by the metadata's "name", and each of its
    entries ends with "time", a UTC timestamp. Inside a JSON string a '"' is escaped, so that end
    cannot be inside one. Where a body is not laid out so (pretty-printed, an entry without a
    time), it is returned whole, and decoded as it came."""
    start = body.find(_MANAGED_FIELDS)
    if start < 0:
        return body
    parts, pos = [], 0
    while start >= 0:
        inner = start + len(_MANAGED_FIELDS)
        end = body.find(_MANAGED_FIELDS_END, inner)
        following = body.find(_MANAGED_FIELDS, inner)
        if end < 0 or 0 <= following < end:
            return body  # not where it should end before the next object's: decode it all
        parts.append(body[pos:start])
        pos = end + _CUT_TO
        start = following
    parts.append(body[pos:])
    return b"".join(parts)


def _decode_page(body, managed_fields=True):
    if not managed_fields:
        lean = without_managed_fields(body)
        if lean is not body:
            try:
                data = json.loads(lean)
                if all(isinstance(item, dict) and "managedFields" not in (item.get("metadata") or {})
                       and "name" in (item.get("metadata") or {}) for item in data.get("items") or []):
                    return data
            except (ValueError, AttributeError):
                pass  # not as expected: decode the page as it came
    return json.loads(body)


class CapiApiError(Exception):
    """One clear line on what failed and where."""


def _status_message(body):
    try:
        data = json.loads(body)
        return data.get("message") or data.get("reason") or body
    except (ValueError, TypeError, AttributeError):
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
        return text.strip()


# what OpenSSL says of a certificate Python 3.13's strict X.509 checks (ssl.VERIFY_X509_STRICT) refuse
_STRICT_X509 = ("key usage", "basic constraints", "Basic Constraints", "authority key identifier",
                "subject key identifier", "invalid CA certificate")


def strict_x509_hint(text):
    """What to tell of a verification failure that only a strict check makes: Python 3.13 and later verify
    certificates strictly by default, and a CA made without the extensions a real CA puts in is refused."""
    if not any(marker in text for marker in _STRICT_X509):
        return ""
    return ("; Python 3.13 and later check certificates strictly (VERIFY_X509_STRICT): the CA needs "
            "basicConstraints CA:TRUE and keyUsage keyCertSign (both critical) and the server's certificate a "
            "subjectAltName, as kubeadm's have - make the CA again with them (docs/inventory.md)")


def scrub(text, secrets=()):
    """A library's error text without credentials: bearer tokens and the given secrets removed."""
    text = _BEARER.sub(r"\1<redacted>", str(text))
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "<redacted>")
    return text


def _kubeconfig_paths(auth):
    """The kubeconfig file(s) this configuration would read, as kubectl looks for them."""
    kubeconfig = auth.get("kubeconfig")
    if isinstance(kubeconfig, dict):
        return []
    if kubeconfig:
        value, origin = kubeconfig, "kubeconfig"
    elif os.environ.get("KUBECONFIG"):
        value, origin = os.environ["KUBECONFIG"], "$KUBECONFIG"
    else:
        value, origin = "~/.kube/config", None
    return [(os.path.expanduser(p), origin) for p in value.split(os.pathsep) if p]


# AUTH_ARG_MAP's keys that are not a Configuration's settings
_NOT_SETTINGS = ("kubeconfig", "context", "persist_config", "api_key", "proxy_headers")


def _load_kubeconfig(auth, configuration):
    """The kubeconfig (a path, several paths, a dict; else $KUBECONFIG, ~/.kube/config) into configuration."""
    kubeconfig = auth.get("kubeconfig")
    options = dict(context=auth.get("context"), client_configuration=configuration,
                   persist_config=bool(auth.get("persist_config")))
    if isinstance(kubeconfig, dict):
        k8s_config.load_kube_config_from_dict(config_dict=kubeconfig, **options)
    else:
        k8s_config.load_kube_config(config_file=kubeconfig or None, **options)


def own_configuration(auth):
    """A kubernetes.client.Configuration of this client's own, from kubernetes.core's auth spec, in its
    order: host with a token, a user and password or a client certificate; else a kubeconfig (or a
    context); else in-cluster, then the default kubeconfig; the given options on top.

    kubernetes.core's _create_configuration starts from the library's process-wide default
    (get_default_copy), which load_kube_config without a client_configuration replaces, token-refresh
    hook included: in one process, a client given host and api_key after any kubeconfig was loaded
    (the inventory in ansible-playbook, a first event source in ansible-rulebook) sent that
    kubeconfig's token instead. Here every configuration starts empty, a kubeconfig is loaded into it
    and nowhere else, and a given api_key is the one sent: nothing loaded earlier reaches it."""
    configuration = k8s_client.Configuration()

    def given(*names):
        return all(auth.get(name) for name in names)

    if not (given("username", "password", "host") or given("api_key", "host") or given("cert_file", "key_file", "host")):
        if given("kubeconfig") or given("context"):
            _load_kubeconfig(auth, configuration)
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
            except ConfigException:
                _load_kubeconfig(auth, configuration)
    for key, value in auth.items():
        if value is None or key not in AUTH_ARG_MAP:
            continue
        if key == "api_key":
            configuration.api_key = {"authorization": "Bearer %s" % value}
            configuration.refresh_api_key_hook = None  # a kubeconfig's would put its own token back
        elif key == "proxy_headers":
            configuration.proxy_headers = urllib3.util.make_headers(**value)
        elif key not in _NOT_SETTINGS:
            setattr(configuration, key, value)
    return configuration


def build_configuration(**options):
    """A kubernetes.client.Configuration and the extra headers, as kubernetes.core builds them.

    options are kubernetes.core's auth options (None: from K8S_AUTH_*). Order, as
    kubernetes.core: an explicit host with a token or client certificate; else a
    kubeconfig (path, several paths separated by ':', or a dict; $KUBECONFIG; then
    ~/.kube/config) or the in-cluster service account. An explicit host alone talks
    to the API anonymously.
    """
    if not HAS_KUBERNETES:
        raise CapiApiError("the Python 'kubernetes' library is required on the control node "
                           "(pip install kubernetes): %s" % KUBERNETES_IMPORT_ERROR)
    if not HAS_K8S_CORE:
        raise CapiApiError("the kubernetes.core collection is required (it comes with the ansible package)")
    auth = _create_auth_spec(**{k: v for k, v in options.items() if k in AUTH_OPTIONS})
    if isinstance(auth.get("api_key"), str):
        # a token read with $(cat file) or from a Secret often ends in a newline
        auth["api_key"] = auth["api_key"].strip()
    secrets = [auth.get("api_key"), auth.get("password")]
    for path in (auth.get("ssl_ca_cert"), auth.get("cert_file"), auth.get("key_file")):
        if path and not os.path.exists(path):
            raise CapiApiError("certificate file %s does not exist" % path)
    has_credentials = auth.get("host") and (auth.get("api_key") or auth.get("cert_file")
                                            or (auth.get("username") and auth.get("password")))
    paths = [] if has_credentials else _kubeconfig_paths(auth)
    named = [path for path, origin in paths if origin]
    if named and not any(os.path.exists(path) for path in named):
        raise CapiApiError("kubeconfig %s%s does not exist" % (
            ", ".join(named), " (from $KUBECONFIG)" if paths[0][1] == "$KUBECONFIG" else ""))
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not has_credentials and not named and not in_cluster and not any(os.path.exists(p[0]) for p in paths):
        if not auth.get("host"):
            raise CapiApiError("no Kubernetes API to talk to: set host (K8S_AUTH_HOST) or kubeconfig "
                               "(K8S_AUTH_KUBECONFIG or $KUBECONFIG), or provide ~/.kube/config")
        configuration = k8s_client.Configuration()  # an explicit host alone: anonymous requests
        configuration.host = auth["host"].rstrip("/")
        for key in ("verify_ssl", "ssl_ca_cert", "proxy", "no_proxy"):
            if auth.get(key) is not None:
                setattr(configuration, key, auth[key])
    else:
        where = "(given as a dict)" if isinstance(auth.get("kubeconfig"), dict) else \
            ", ".join(p[0] for p in paths) or "(in-cluster)"
        try:
            configuration = own_configuration(auth)
        except (ConfigException, ValueError, TypeError, KeyError) as exc:
            raise CapiApiError("cannot use kubeconfig %s%s: %s" % (
                where, " (context %s)" % auth["context"] if auth.get("context") else "",
                scrub(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, secrets)))
        except Exception as exc:  # yaml errors and the like
            raise CapiApiError("cannot read kubeconfig %s: %s" % (where, scrub(str(exc).splitlines()[0], secrets)))
    return configuration, _create_headers(**{k: v for k, v in options.items() if k in AUTH_OPTIONS})


def read_secret(name, namespace, kubeconfig=None, context=None, timeout=30):
    """The Secret namespace/name as the API returns it (a dict), or None when it does not exist.
    One GET, with the credentials kubernetes.core would use; failures raise CapiApiError."""
    configuration, headers = build_configuration(kubeconfig=kubeconfig or None, context=context or None)
    reader = CapiReader(configuration, timeout=timeout, headers=headers)
    try:
        status, body = reader.request("/api/v1/namespaces/%s/secrets/%s" % (quote(namespace, safe=""),
                                                                            quote(name, safe="")))
    finally:
        reader.close()
    if status == 404:
        return None
    if status != 200:
        raise CapiApiError("HTTP %s: %s" % (status, _status_message(body)))
    return json.loads(body)


class CapiReader:
    """Discovery and paginated lists over one connection pool."""

    def __init__(self, configuration, page_size=500, timeout=60, headers=None):
        self.configuration = configuration
        self.extra_headers = dict(headers or {})
        self.host = configuration.host
        self.page_size = page_size
        self.timeout = timeout
        try:
            self.api_client = k8s_client.ApiClient(configuration)
        except Exception as exc:  # bad certificate files and the like
            raise CapiApiError("cannot set up a client for %s: %s" % (self.host, scrub(exc, self._secrets())))
        self.pool = self.api_client.rest_client.pool_manager
        self.requests = 0
        self.look_ahead = True
        self._lock = threading.Lock()
        self._executors = {}

    def close(self):
        for name in ("fetch", "lists", "ahead"):
            executor = self._executors.pop(name, None)
            if executor is not None:
                executor.shutdown(wait=True)
        try:
            self.api_client.close()
        except Exception:  # pragma: no cover - best effort
            pass

    def _secrets(self):
        key = (self.configuration.api_key or {}).get("authorization", "")
        return [key, key.split(" ", 1)[-1], self.configuration.password]

    def _headers(self):
        headers = HTTPHeaderDict({"Accept": "application/json", "User-Agent": "converged.hpc/capi_machines"})
        for name, value in self.extra_headers.items():  # impersonation: one header line per group
            for one in value if isinstance(value, list) else [value]:
                headers.add(name, one)
        for setting in self.configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    def request(self, path, query=None, method="GET", body=None, content_type="application/json"):
        """One request (GET unless told); return (status, body bytes). body: a dict sent as JSON.
        Connection failures raise CapiApiError."""
        url = self.host + path + ("?" + urlencode(query) if query else "")
        with self._lock:
            self.requests += 1
        headers = self._headers()
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            resp = self.pool.request(method, url, headers=headers, body=payload, preload_content=True,
                                     timeout=self.timeout, retries=False)
        except Exception as exc:  # urllib3 errors: refused, DNS, TLS, timeout, bad header values
            reason = getattr(exc, "reason", None) or exc
            text = scrub(reason, self._secrets())
            if "CERTIFICATE_VERIFY_FAILED" in text or "SSLCertVerificationError" in text or "certificate verify" in text:
                raise CapiApiError("TLS verification of the Kubernetes API at %s failed (ca_cert / "
                                   "K8S_AUTH_SSL_CA_CERT, or the kubeconfig's certificate-authority): %s%s"
                                   % (self.host, text, strict_x509_hint(text)))
            raise CapiApiError("cannot reach the Kubernetes API at %s: %s" % (self.host, text))
        return resp.status, resp.data

    def watch(self, path, query, read_timeout):
        """Yield the events (dicts) of a watch until the server ends it. A dropped or refused
        connection raises CapiApiError; a non-200 answer is yielded as an ERROR event."""
        url = self.host + path + "?" + urlencode(query)
        self.requests += 1
        try:
            import urllib3  # pylint: disable=import-outside-toplevel
            resp = self.pool.request("GET", url, headers=self._headers(), preload_content=False, retries=False,
                                     timeout=urllib3.Timeout(connect=self.timeout, read=read_timeout))
        except Exception as exc:
            reason = scrub(getattr(exc, "reason", None) or exc, self._secrets())
            raise CapiApiError("cannot watch %s at %s: %s" % (path, self.host, reason))
        try:
            if resp.status != 200:
                body = resp.read()
                try:
                    status = json.loads(body)
                except ValueError:
                    status = {"code": resp.status, "message": _status_message(body)}
                yield {"type": "ERROR", "object": status}
                return
            pending = b""
            for chunk in resp.stream(65536):
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        except (ValueError, CapiApiError):
            raise
        except Exception as exc:  # the connection dropped mid-stream
            raise CapiApiError("the watch of %s at %s broke: %s" % (path, self.host, scrub(exc, self._secrets())))
        finally:
            resp.release_conn()

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

    def list(self, group, version, plural, namespace=None, label_selector=None, restarts=2, transform=None,
             managed_fields=True, on_page=None):
        """All items of a kind, page by page; an expired continue token restarts the list (410).

        transform: applied to each item as its page is decoded (the plugin trims them, so a
        page's full objects are dropped at once). While a page is decoded the next one is
        already asked for (its token read from the page's end): the server writes page n+1
        while this process decodes page n. managed_fields=False: the items come without
        metadata.managedFields, which are then not decoded at all. on_page: called with each page's
        (transformed) items as it is decoded, and with None when the list starts again (410)."""
        base = "/apis/%s/%s" % (group, version)
        path = "%s/namespaces/%s/%s" % (base, namespace, plural) if namespace else "%s/%s" % (base, plural)
        what = "%s.%s%s" % (plural, group, " in namespace %s" % namespace if namespace else "")
        items, token, ahead = [], None, None
        while True:
            query = {"limit": self.page_size}
            if label_selector:
                query["labelSelector"] = label_selector
            if token:
                query["continue"] = token
            if ahead is not None and ahead[0] == token:
                status, body = ahead[1].result()
            else:
                status, body = self.request(path, query)
            ahead = None
            if status == 410 and token and restarts > 0:
                # the snapshot behind the token is gone: start a consistent list again
                restarts -= 1
                items, token = [], None
                if on_page is not None:
                    on_page(None)
                continue
            if status == 404 and namespace:
                return []  # a namespace that does not exist holds nothing
            if status != 200:
                self._fail(status, body, what)
            if self.look_ahead:
                next_token = continue_token(body)
                if next_token:
                    ahead = (next_token, self._pool("ahead").submit(self.request, path,
                                                                    dict(query, **{"continue": next_token})))
            try:
                data = _decode_page(body, managed_fields)
            except ValueError:
                raise CapiApiError("listing %s at %s returned something that is not JSON" % (what, self.host))
            del body
            page = data.get("items") or []
            if transform:
                page = [transform(item) for item in page]
            items.extend(page)
            if on_page is not None:
                on_page(page)
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                return items

    def list_many(self, lists):
        """Several lists at once, each in a thread of its own: {key: (args, kwargs)} -> {key: items or
        the CapiApiError it raised}. The server works on them in parallel."""
        futures = {key: self._pool("lists").submit(self.list, *args, **kwargs) for key, (args, kwargs) in lists.items()}
        out = {}
        for key, future in futures.items():
            try:
                out[key] = future.result()
            except CapiApiError as exc:
                out[key] = exc
        return out

    def submit(self, fn, *args):
        """fn(*args) in a thread of its own (a caller that works on the pages while they are read)."""
        return self._pool("fetch").submit(fn, *args)

    def _pool(self, name):
        """Lists and look-aheads have pools of their own: a list waits for its look-ahead, which
        must never queue behind lists (many namespaces would fill a shared pool with lists)."""
        with self._lock:
            if name not in self._executors:
                self._executors[name] = ThreadPoolExecutor(max_workers=8, thread_name_prefix="capi-" + name)
            return self._executors[name]
