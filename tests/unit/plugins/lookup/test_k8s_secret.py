"""converged.hpc.k8s_secret and capi_client.read_secret on a real kube-apiserver: a Secret as the API
returns it, an absent one, a refused read named without the token, and bad terms. The Secret is in a namespace of the test's own."""

import base64

import pytest
from ansible.errors import AnsibleError

from conftest import READONLY_TOKEN

from ansible_collections.converged.hpc.plugins.lookup.k8s_secret import LookupModule
from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError, read_secret

KEY = base64.b64encode(b"k" * 128).decode()


def lookup(*terms, **options):
    return LookupModule().run(list(terms), variables={}, **options)


@pytest.fixture
def api(backend, monkeypatch):
    """The backend with a munge key Secret in a namespace of the test's own (api.ns), reached through
    K8S_AUTH_* as AWX's credential would."""
    for key, value in backend.auth_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    backend.ns = backend.namespace()
    backend.api().create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {"munge.key": KEY},
                          "metadata": {"name": "hpc-munge-key", "namespace": backend.ns}})
    return backend


def test_read_secret_returns_the_secret_or_none(api):
    secret = read_secret("hpc-munge-key", api.ns)
    assert secret["data"] == {"munge.key": KEY}
    assert secret["metadata"]["uid"] and secret["metadata"]["resourceVersion"]
    assert read_secret("hpc-munge-key", "default") is None
    assert read_secret("no-such-secret", api.ns) is None
    assert read_secret("hpc-munge-key", "no-such-namespace") is None


def test_the_lookup_returns_the_secret_or_an_empty_mapping(api):
    (secret,) = lookup("hpc-munge-key", namespace=api.ns)
    assert secret["data"]["munge.key"] == KEY and secret["kind"] == "Secret"
    assert lookup("absent", namespace=api.ns) == [{}]


def test_a_refused_read_names_the_secret_and_the_reason_never_the_token(api, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_API_KEY", READONLY_TOKEN)  # may read Machines only
    with pytest.raises(AnsibleError) as err:
        lookup("hpc-munge-key", namespace=api.ns)
    text = str(err.value)
    assert text.startswith("cannot read Secret %s/hpc-munge-key: HTTP 403" % api.ns)
    assert READONLY_TOKEN not in text and KEY not in text
    with pytest.raises(CapiApiError):
        read_secret("hpc-munge-key", api.ns)


def test_an_unreachable_api_is_named(api, monkeypatch, free_port):
    monkeypatch.setenv("K8S_AUTH_HOST", "http://127.0.0.1:%d" % free_port)
    with pytest.raises(AnsibleError, match=r"cannot read Secret %s/hpc-munge-key: cannot reach the Kubernetes API"
                       % api.ns):
        lookup("hpc-munge-key", namespace=api.ns)


@pytest.mark.parametrize("terms", [[], ["a", "b"], [""], [3]])
def test_it_takes_exactly_one_name(terms):
    with pytest.raises(AnsibleError, match="k8s_secret takes one Secret name"):
        lookup(*terms)


def test_an_unknown_or_mistyped_option_is_named():
    with pytest.raises(AnsibleError, match="k8s_secret has no option namepsace"):
        lookup("hpc-munge-key", namepsace="hpc")
    with pytest.raises(AnsibleError, match="k8s_secret: namespace must be a string, got 3"):
        lookup("hpc-munge-key", namespace=3)
