"""converged.hpc.k8s_secret and capi_client.read_secret against the simulator: a Secret as the API
returns it, an absent one, a refused read named without the token, and bad terms."""

import base64

import pytest
from ansible.errors import AnsibleError

from conftest import ADMIN_TOKEN, READONLY_TOKEN

from ansible_collections.converged.hpc.plugins.lookup.k8s_secret import LookupModule
from ansible_collections.converged.hpc.plugins.module_utils.capi_client import CapiApiError, read_secret

KEY = base64.b64encode(b"k" * 128).decode()


def lookup(*terms, **options):
    return LookupModule().run(list(terms), variables={}, **options)


@pytest.fixture
def api(sim, monkeypatch):
    """The simulator with a munge key Secret, reached through K8S_AUTH_* as AWX's credential would."""
    monkeypatch.setenv("K8S_AUTH_HOST", sim.url)
    monkeypatch.setenv("K8S_AUTH_API_KEY", ADMIN_TOKEN)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    sim.store.create(sim.store.resource("", "secrets"), "hpc", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hpc-munge-key", "namespace": "hpc"},
        "type": "Opaque", "data": {"munge.key": KEY}})
    return sim


def test_read_secret_returns_the_secret_or_none(api):
    secret = read_secret("hpc-munge-key", "hpc")
    assert secret["data"] == {"munge.key": KEY}
    assert secret["metadata"]["uid"] and secret["metadata"]["resourceVersion"]
    assert read_secret("hpc-munge-key", "default") is None
    assert read_secret("no-such-secret", "hpc") is None


def test_the_lookup_returns_the_secret_or_an_empty_mapping(api):
    (secret,) = lookup("hpc-munge-key", namespace="hpc")
    assert secret["data"]["munge.key"] == KEY and secret["kind"] == "Secret"
    assert lookup("absent", namespace="hpc") == [{}]


def test_a_refused_read_names_the_secret_and_the_reason_never_the_token(api, monkeypatch):
    monkeypatch.setenv("K8S_AUTH_API_KEY", READONLY_TOKEN)  # may read Machines only
    with pytest.raises(AnsibleError) as err:
        lookup("hpc-munge-key", namespace="hpc")
    text = str(err.value)
    assert text.startswith("cannot read Secret hpc/hpc-munge-key: HTTP 403")
    assert READONLY_TOKEN not in text and KEY not in text
    with pytest.raises(CapiApiError):
        read_secret("hpc-munge-key", "hpc")


def test_an_unreachable_api_is_named(api, monkeypatch, free_port):
    monkeypatch.setenv("K8S_AUTH_HOST", "http://127.0.0.1:%d" % free_port)
    with pytest.raises(AnsibleError, match=r"cannot read Secret hpc/hpc-munge-key: cannot reach the Kubernetes API"):
        lookup("hpc-munge-key", namespace="hpc")


@pytest.mark.parametrize("terms", [[], ["a", "b"], [""], [3]])
def test_it_takes_exactly_one_name(terms):
    with pytest.raises(AnsibleError, match="k8s_secret takes one Secret name"):
        lookup(*terms)


def test_an_unknown_or_mistyped_option_is_named():
    with pytest.raises(AnsibleError, match="k8s_secret has no option namepsace"):
        lookup("hpc-munge-key", namepsace="hpc")
    with pytest.raises(AnsibleError, match="k8s_secret: namespace must be a string, got 3"):
        lookup("hpc-munge-key", namespace=3)
