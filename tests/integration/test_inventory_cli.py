"""ansible-inventory with converged.hpc.capi_machines on a real kube-apiserver holding the recorded objects
only (one of the module's own: the plugin lists every namespace), what it asked read from the server's audit
log; a server that is gone, one serving Cluster API v1beta1 only, and one without Cluster API, each a
kube-apiserver of the test's own."""

import contextlib
import json
import os
import subprocess

import pytest
import yaml

import kubeapi
from conftest import ADMIN_TOKEN, READONLY_TOKEN, ansible_env, load_fixture, recorded


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    """The recorded objects on a server of the module's own that keeps an audit log of every request."""
    if kubeapi.assets()[1]:
        pytest.skip("real kube-apiserver tier skipped: " + kubeapi.assets()[1])
    with recorded(tmp_path_factory.mktemp("inventory-apiserver"), audit=True) as server:
        yield server


@pytest.fixture
def sim(module_server):
    """The server; sim.asked() is what the plugin (the admin) asked it since the test began."""
    start = len(module_server.requests(user="admin"))
    module_server.asked = lambda: module_server.requests(user="admin")[start:]
    return module_server


@pytest.fixture
def own_server(tmp_path):
    """A kube-apiserver of the test's own (stopped by it, or given other CRDs): own_server(crds=..., docs=...)."""
    with contextlib.ExitStack() as servers:
        count = iter(range(100))

        def start(crds=kubeapi.CRDS, docs=None):
            if kubeapi.assets()[1]:
                pytest.skip("real kube-apiserver tier skipped: " + kubeapi.assets()[1])
            return servers.enter_context(recorded(tmp_path / ("apiserver-%d" % next(count)), docs, crds=crds))
        yield start


def auth(server, token=ADMIN_TOKEN):
    """The plugin's options to reach server with token (none: anonymous)."""
    return dict({"host": server.url, "ca_cert": server.ca_cert}, **({"api_key": token} if token else {}))


def auth_env(server, token=ADMIN_TOKEN):
    return {"K8S_AUTH_HOST": server.url, "K8S_AUTH_API_KEY": token, "K8S_AUTH_SSL_CA_CERT": server.ca_cert}


def inventory(tmp_path, config, env=None, extra_args=("--list",), name="test.capi_machines.yml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(dict({"plugin": "converged.hpc.capi_machines"}, **config)))
    proc = subprocess.run(["ansible-inventory", "-i", str(path), *extra_args], capture_output=True, text=True,
                          env=ansible_env(**(env or {})), cwd=str(tmp_path), timeout=120, check=False)
    return proc


def _plain(value):
    """ansible-core 2.19 marks values from inventory sources untrusted: {"__ansible_unsafe": v}."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def listing(proc):
    assert proc.returncode == 0, proc.stderr
    return _plain(json.loads(proc.stdout))


def error_line(proc):
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if "converged.hpc.capi_machines" in line]
    assert lines, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_groups_and_hostvars_over_http(sim, tmp_path):
    data = listing(inventory(tmp_path, {**auth(sim, ADMIN_TOKEN)}))
    assert sorted(data["controller"]["hosts"]) == ["hpc-controller-5c6b9-q8m4n", "hpc-controller-5c6b9-x7k2p"]
    assert len(data["compute"]["hosts"]) == 4
    assert data["capi_deleting"]["hosts"] == ["hpc-compute-7d9f8-pqrst"]
    hv = data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]
    assert hv["ansible_host"] == "192.168.111.21" and hv["capi"]["cpus"] == 128


def test_paginates_one_list_per_kind_never_a_get_per_machine(sim, tmp_path):
    listing(inventory(tmp_path, {**auth(sim, ADMIN_TOKEN), "page_size": 3}))
    kinds = ("/machines", "/metal3machines", "/baremetalhosts")
    lists = [(p, q) for m, p, q in sim.asked() if m == "list" and p.endswith(kinds)]
    machine_pages = [q for p, q in lists if p.endswith("/machines")]
    assert len(machine_pages) == 4  # 10 Machines, 3 a page
    assert all(q["limit"] == "3" for q in machine_pages) and "continue" in machine_pages[1]
    gets = [p for m, p, q in sim.asked() if "/namespaces/" in p]
    assert gets == []


def test_warnings_name_the_machines(sim, tmp_path):
    proc = inventory(tmp_path, {**auth(sim, ADMIN_TOKEN)})
    assert proc.returncode == 0
    assert "metal3/hpc-compute-7d9f8-uvwxy skipped" in proc.stderr
    assert "GPU_Compute_v2" in proc.stderr


def test_kubeconfig_and_context(sim, tmp_path):
    kubeconfig = {
        "apiVersion": "v1", "kind": "Config", "current-context": "wrong",
        "clusters": [{"name": "sim", "cluster": {"server": sim.url, "certificate-authority": sim.ca_cert}},
                     {"name": "nowhere", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "admin", "user": {"token": ADMIN_TOKEN}}],
        "contexts": [{"name": "mgmt", "context": {"cluster": "sim", "user": "admin"}},
                     {"name": "wrong", "context": {"cluster": "nowhere", "user": "admin"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig))
    data = listing(inventory(tmp_path, {"kubeconfig": str(path), "context": "mgmt"}))
    assert len(data["controller"]["hosts"]) == 2
    # the K8S_AUTH_* variables work as for kubernetes.core
    data = listing(inventory(tmp_path, {}, env={"K8S_AUTH_KUBECONFIG": str(path), "K8S_AUTH_CONTEXT": "mgmt"}))
    assert len(data["controller"]["hosts"]) == 2


def test_env_host_and_token(sim, tmp_path):
    data = listing(inventory(tmp_path, {"namespaces": ["lab2"]},
                             env=auth_env(sim, ADMIN_TOKEN)))
    assert sorted(data["compute"]["hosts"]) == ["edge-workers-6f5d4-m2wq7", "edge-workers-6f5d4-r8t3k"]


def test_label_selector_and_clusters_are_sent_to_the_server(sim, tmp_path):
    data = listing(inventory(tmp_path, {**auth(sim, ADMIN_TOKEN), "clusters": ["hpc"],
                                        "label_selector": "node-type=controller"}))
    assert "compute" not in data and len(data["controller"]["hosts"]) == 2
    selectors = [q.get("labelSelector") for m, p, q in sim.asked() if p.endswith("/machines")]
    assert selectors == ["node-type=controller,cluster.x-k8s.io/cluster-name in (hpc)"]


def test_constructed_options(sim, tmp_path):
    data = listing(inventory(tmp_path, {
        **auth(sim, ADMIN_TOKEN), "group_prefix": "slurm_",
        "compose": {"slurm_cpus": "capi.cpus"},
        "keyed_groups": [{"key": "capi.labels['slurm.example.org/partition'] | default('none')",
                          "prefix": "partition"}]}))
    assert "slurm_compute" in data and "partition_batch" in data
    assert data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]["slurm_cpus"] == 128


def test_inventory_cache_serves_when_the_api_is_gone(own_server, tmp_path):
    server = own_server()
    config = {**auth(server, ADMIN_TOKEN), "cache": True,
              "cache_plugin": "ansible.builtin.jsonfile", "cache_connection": str(tmp_path / "cache"),
              "cache_timeout": 600}
    first = listing(inventory(tmp_path, config))
    server.stop()
    second = listing(inventory(tmp_path, config))
    assert first == second
    cached = "".join(p.read_text() for p in (tmp_path / "cache").iterdir())
    assert ADMIN_TOKEN not in cached and "managedFields" not in cached


def crds_of(tmp_path, keep):
    """A copy of the CRDs: those of cluster.x-k8s.io kept as keep(crd) makes them (None: left out)."""
    out = tmp_path / "crds"
    out.mkdir()
    for name in sorted(os.listdir(kubeapi.CRDS)):
        docs = [d for d in kubeapi.read_yaml(os.path.join(kubeapi.CRDS, name)) if d]
        if name.startswith("cluster.x-k8s.io_"):
            docs = [d for d in (keep(d) for d in docs) if d]
        if docs:
            (out / name).write_text(yaml.safe_dump_all(docs))
    return str(out)


def v1beta1_only(crd):
    versions = [dict(v, storage=True) for v in crd["spec"]["versions"] if v["name"] == "v1beta1"]
    return dict(crd, spec=dict(crd["spec"], versions=versions))


def test_v1beta1_only_server(own_server, tmp_path):
    # the recorded v1beta1 view of v1beta2 Machines; as a v1beta1 controller writes them, an empty condition
    # message is left out (the v1beta1 schema refuses "")
    docs = load_fixture("machines-v1beta1.yaml")
    for doc in docs:
        for cond in (doc.get("status") or {}).get("conditions") or []:
            if cond.get("message") == "":
                del cond["message"]
    server = own_server(crds=crds_of(tmp_path, v1beta1_only), docs=docs)
    groups = server.api().request("GET", "/apis/cluster.x-k8s.io")
    assert [v["version"] for v in groups[1]["versions"]] == ["v1beta1"], groups
    data = listing(inventory(tmp_path, {**auth(server, ADMIN_TOKEN)}))
    assert len(data["controller"]["hosts"]) == 2
    hv = data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]["capi"]
    assert hv["api_version"] == "cluster.x-k8s.io/v1beta1"


# ----------------------------------------------------------------- bad input
def test_unreachable_api(tmp_path, free_port):
    line = error_line(inventory(tmp_path, {"host": "http://127.0.0.1:%d" % free_port, "api_key": "x"}))
    assert "cannot reach the Kubernetes API at http://127.0.0.1:%d" % free_port in line


def test_bad_token_is_401(sim, tmp_path):
    line = error_line(inventory(tmp_path, {**auth(sim, "wrong")}))
    assert "401 Unauthorized" in line and sim.url in line


def test_anonymous_is_403(sim, tmp_path):
    line = error_line(inventory(tmp_path, auth(sim, None)))
    assert "403 Forbidden" in line or "forbidden" in line.lower()


def test_readonly_token_gets_machines_and_a_metal3_warning(sim, tmp_path):
    proc = inventory(tmp_path, {**auth(sim, READONLY_TOKEN)})
    data = listing(proc)
    assert len(data["controller"]["hosts"]) == 2
    assert data["_meta"]["hostvars"]["hpc-compute-7d9f8-abcde"]["capi"]["cpus"] is None
    assert "no Metal3 hardware data" in proc.stderr and "403" in proc.stderr
    # metal3: always turns the same into a failure
    line = error_line(inventory(tmp_path, {**auth(sim, READONLY_TOKEN), "metal3": "always"}))
    assert "403" in line


def test_missing_capi_crds(own_server, tmp_path):
    server = own_server(crds=None, docs=[])
    line = error_line(inventory(tmp_path, {**auth(server, ADMIN_TOKEN)}))
    assert "Cluster API is not installed at %s" % server.url in line


def test_bad_kubeconfig(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    line = error_line(inventory(tmp_path, {"kubeconfig": str(path)}))
    assert "kubeconfig %s" % path in line
    line = error_line(inventory(tmp_path, {"kubeconfig": str(tmp_path / "missing")}))
    assert "missing does not exist" in line


def test_token_never_in_output(sim, tmp_path):
    proc = inventory(tmp_path, {**auth(sim, ADMIN_TOKEN)}, extra_args=("--list", "-vvv"))
    assert proc.returncode == 0
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr


def test_unknown_file_name_is_not_claimed(tmp_path):
    proc = inventory(tmp_path, {"host": "http://127.0.0.1:1"}, name="other.yml")
    assert "converged.hpc.capi_machines" not in proc.stdout


# ----------------------------------------------------------------- connection, as kubernetes.core
def _kubeconfig(path, server, token, name="mgmt", ca=None):
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [{"name": name, "cluster": dict({"server": server}, **({"certificate-authority": ca} if ca else {}))}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}]}))
    return path


def test_token_with_a_trailing_newline_works_and_is_never_printed(sim, tmp_path):
    data = listing(inventory(tmp_path, {}, env=auth_env(sim, ADMIN_TOKEN + "\n")))
    assert len(data["controller"]["hosts"]) == 2
    # a token no HTTP library accepts: the error names the problem, not the token
    bad = "s3cr3t-t0ken\nX-Injected: 1"
    proc = inventory(tmp_path, {}, env=auth_env(sim, bad),
                     extra_args=("--list", "-vvv"))
    assert proc.returncode != 0
    assert "s3cr3t-t0ken" not in proc.stdout + proc.stderr


def test_kubeconfig_environment_missing_file_is_named(tmp_path):
    missing = tmp_path / "nowhere.yaml"
    line = error_line(inventory(tmp_path, {}, env={"KUBECONFIG": str(missing)}))
    assert "kubeconfig %s (from $KUBECONFIG) does not exist" % missing in line


def test_kubeconfig_environment_with_several_files_is_merged(sim, tmp_path):
    # as kubectl: the first file sets the current context, the second holds it
    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "mgmt"}))
    second = _kubeconfig(tmp_path / "second.yaml", sim.url, ADMIN_TOKEN, ca=sim.ca_cert)
    data = listing(inventory(tmp_path, {}, env={"KUBECONFIG": "%s:%s" % (first, second)}))
    assert len(data["controller"]["hosts"]) == 2


def test_kubeconfig_option_with_several_files(sim, tmp_path):
    other = _kubeconfig(tmp_path / "other.yaml", "http://127.0.0.1:1", "unused", name="other")
    mine = _kubeconfig(tmp_path / "mine.yaml", sim.url, ADMIN_TOKEN, ca=sim.ca_cert)
    data = listing(inventory(tmp_path, {"kubeconfig": "%s:%s" % (other, mine), "context": "mgmt"}))
    assert len(data["controller"]["hosts"]) == 2


def test_default_hostvars_are_lean_and_full_on_request(sim, tmp_path):
    lean = listing(inventory(tmp_path, {**auth(sim, ADMIN_TOKEN)}))
    full = listing(inventory(tmp_path, {**auth(sim, ADMIN_TOKEN), "hostvars": "full"}))
    host = "hpc-compute-7d9f8-abcde"
    small, big = lean["_meta"]["hostvars"][host]["capi"], full["_meta"]["hostvars"][host]["capi"]
    assert "nics" not in small and "provider_id" not in small and "cluster.x-k8s.io/cluster-name" not in small["labels"]
    assert small["cpus"] == big["cpus"] == 128 and small["cluster"] == big["cluster"] == "hpc"
    assert [n["name"] for n in big["nics"]] == ["eno1", "ens3f0np0"]
    assert {k: v for k, v in lean.items() if k != "_meta"} == {k: v for k, v in full.items() if k != "_meta"}
    assert len(json.dumps(lean)) < len(json.dumps(full)) * 0.7


def test_cache_is_valid_only_for_the_options_it_was_mapped_with(own_server, tmp_path):
    server = own_server()
    config = {**auth(server, ADMIN_TOKEN), "cache": True,
              "cache_plugin": "ansible.builtin.jsonfile", "cache_connection": str(tmp_path / "cache"),
              "cache_timeout": 600}
    host = "hpc-compute-7d9f8-abcde"
    try:
        lean = listing(inventory(tmp_path, config))
        assert "nics" not in lean["_meta"]["hostvars"][host]["capi"]
        full = listing(inventory(tmp_path, dict(config, hostvars="full")))  # other options: read again
        assert full["_meta"]["hostvars"][host]["capi"]["nics"]
    finally:
        server.stop()
    assert listing(inventory(tmp_path, dict(config, hostvars="full"))) == full  # from the cache
    # the same file with other options and no API: an error, never hosts mapped another way
    line = error_line(inventory(tmp_path, dict(config, node_type_label="role")))
    assert "cannot reach the Kubernetes API" in line
