"""KEDA for real: its operator and metrics server (v2.21, built by make kube-assets KEDA=1) and
kube-controller-manager's HPA controller, against the real kube-apiserver (aggregation layer on), Cluster API,
CAPM3 and the Bare Metal Operator, scaling a compute MachineDeployment through its /scale by the demand of a
Slurm partition read from slurmrestd's jobs (a stand-in here that answers as slurmrestd v0.0.42 does, and
refuses a request without the token; the lab's e2e asks the real one).

The ScaledObject and TriggerAuthentication are the ones docs/autoscale.md shows (a metrics-api trigger, its
valueLocation made by converged.hpc.keda_demand, the token as an apiKey header); what the test checks is
what KEDA and Cluster API did: the metric KEDA serves through the aggregator, the replicas, the Machines,
the hosts.
"""

import base64
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import kubeapi
from ansible_collections.converged.hpc.plugins.filter.keda import keda_demand
from conftest import REPO, ansible_env
from test_controllers import CAPI, host_states, make_cluster, provisioned_machines, register_hosts
from test_rbac import assert_held_to

ASSETS = kubeapi.assets()[0]
NEEDED = kubeapi.Controllers.BINARIES + kubeapi.Keda.BINARIES
MISSING = [b for b in NEEDED if not (ASSETS and os.access(os.path.join(ASSETS, b), os.X_OK))]
if MISSING and os.environ.get("CONVERGED_KEDA_REQUIRED") == "1":  # make kube-keda: never a silent skip
    raise RuntimeError("no %s in $KUBEBUILDER_ASSETS=%s" % (", ".join(MISSING), ASSETS))
pytestmark = pytest.mark.skipif(bool(MISSING), reason="no %s in $KUBEBUILDER_ASSETS (make kube-assets KEDA=1 "
                                "builds them)" % ", ".join(MISSING))

NS = "keda-hpc"
MD = "hpc-compute"
# two JWTs of slurm-keda as scontrol token makes them (header.payload.signature): the first run's, the renewal's
TOKENS = ("eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJzbHVybS1rZWRhIn0.Zmlyc3Q",
          "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJzbHVybS1rZWRhIn0.c2Vjb25k")
TOKEN = TOKENS[1]
POLLING, COOLDOWN, MAX = 5, 20, 3
POOLS = [{"deployment": MD, "partition": "compute", "max": MAX, "polling": POLLING, "cooldown": COOLDOWN}]

# keda.yml's own reads and writes in the management cluster (its Secret read, then tasks/keda_objects.yml), as
# its last plays run them once a controller made the token (or none, when the Secret's is kept)
KEDA_PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/keda.yml]
  vars:
    _converged_autoscale_namespace: {ns}
    keda_token: "{token}"
    keda_token_expires: 1900000000
    keda_pools: {pools}
    keda_plan: "{{{{ keda_pools | converged.hpc.keda_objects('{ns}', 'http://127.0.0.1:{port}/slurm/v0.0.42/jobs') }}}}"
  tasks:
    - name: Read the token's Secret (as keda.yml)
      kubernetes.core.k8s_info:
        api_version: v1
        kind: Secret
        namespace: "{{{{ _converged_keda_namespace }}}}"
        name: "{{{{ _converged_keda_secret }}}}"
      no_log: true

    - name: Write them (as keda.yml)
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/keda_objects.yml
"""


class Slurmrestd(BaseHTTPRequestHandler):
    """GET /slurm/v0.0.42/jobs as slurmrestd answers it (the fields KEDA's path reads), 401 without the token."""
    jobs, asked = [], []

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != "/slurm/v0.0.42/jobs":
            self.send_error(404)
            return
        if self.headers.get("X-SLURM-USER-TOKEN") != TOKEN:
            Slurmrestd.asked.append("refused")
            self.send_error(401)
            return
        Slurmrestd.asked.append("answered")
        body = json.dumps({"jobs": Slurmrestd.jobs, "errors": [], "warnings": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def job(job_id, state, nodes=1, reason="None", partition="compute", dependency=""):
    return {"job_id": job_id, "partition": partition, "job_state": [state], "state_reason": reason,
            "dependency": dependency, "node_count": {"set": True, "infinite": False, "number": nodes}}


@pytest.fixture(scope="module")
def management(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("keda")
    server = kubeapi.KubeApiServer(str(workdir / "apiserver"), crds=kubeapi.module_crds(), aggregation=True,
                                   audit=True)
    server.start()
    controllers = kubeapi.Controllers(server, str(workdir / "controllers"))
    keda = kubeapi.Keda(server, str(workdir / "keda"))
    rest = ThreadingHTTPServer(("127.0.0.1", 0), Slurmrestd)
    threading.Thread(target=rest.serve_forever, daemon=True).start()
    try:
        controllers.start()
        keda.start()
        yield server, controllers, keda, rest.server_address[1]
    finally:
        rest.shutdown()
        keda.stop()
        controllers.stop()
        server.stop()


def wait_for(what, predicate, runners, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(1)
    logs = "\n".join("--- %s\n%s" % (name, runner.log_tail(name, 8))
                     for runner in runners for name in type(runner).BINARIES)
    pytest.fail("%s: not within %d s\n%s" % (what, timeout, logs))


def keda_yml(server, tmp, port, token):
    """keda.yml's writes, run with its own role (rbac/keda.yml with rbac/inventory.yml's) and token given."""
    path = tmp / "keda-play.yml"
    path.write_text(KEDA_PLAY.format(repo=REPO, ns=NS, token=token, pools=json.dumps(POOLS), port=port))
    env = ansible_env(K8S_AUTH_HOST=server.url, K8S_AUTH_API_KEY=kubeapi.KEDA_TOKEN,
                      K8S_AUTH_SSL_CA_CERT=server.ca_cert)
    return subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=" + sys.executable, str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=300)


def recap(proc):
    return proc.stdout.split("PLAY RECAP")[-1]


def scaled_object(api):
    return api.get("keda.sh/v1alpha1", "scaledobjects", NS, MD) or {}


def condition(obj, kind):
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def replicas(api):
    return api.get(CAPI, "machinedeployments", NS, MD)["spec"]["replicas"]


def demand(keda, api):
    """The value KEDA serves for the ScaledObject's metric through the aggregator (the HPA's view)."""
    names = (scaled_object(api).get("status") or {}).get("externalMetricNames") or []
    if not names:
        return None
    items = keda.external_metric(NS, names[0], "scaledobject.keda.sh/name=" + MD)
    return items[0]["value"] if items else None


@pytest.fixture(scope="module")
def cluster(management):
    """Three hosts available and the cluster's compute MachineDeployment at 0, KEDA's scale target."""
    server, controllers, keda, _port = management
    api = server.api()
    register_hosts(api, NS, {"keda-host-%d" % i: "pool" for i in range(MAX)})
    wait_for("the hosts available", lambda: set(host_states(api, NS).values()) == {"available"}, (controllers, keda))
    make_cluster(server, controllers, NS, "keda-hpc", MD, 0, node_type="compute")
    return management


def test_keda_yml_writes_its_objects_with_exactly_its_role(cluster, tmp_path):
    """keda.yml's writes (tasks/keda_objects.yml) with its role: the Secret made with the first token, the
    TriggerAuthentication and the ScaledObject made; a run with no new token changes nothing; a renewal
    rewrites the Secret only. Never a token in the output; never a request refused; every rule used."""
    server, _controllers, _keda, port = cluster
    api = server.api()
    runs = [keda_yml(server, tmp_path, port, token) for token in (TOKENS[0], "", TOKENS[1])]
    for proc in runs:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert not any(token in out for token in TOKENS) and kubeapi.KEDA_TOKEN not in out
    assert "changed=2" in recap(runs[0]) and "(item=ScaledObject %s)" % MD in runs[0].stdout, runs[0].stdout[-2000:]
    assert "changed=0" in recap(runs[1]), runs[1].stdout[-2000:]
    assert "changed=1" in recap(runs[2]), runs[2].stdout[-2000:]
    secret = api.get("v1", "secrets", NS, "slurm-keda-token")
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKENS[1]
    assert secret["metadata"]["annotations"]["converged.hpc/token-expires-at"] == "1900000000"
    assert scaled_object(api)["spec"]["triggers"][0]["metadata"]["valueLocation"] == keda_demand("compute", MAX)
    assert_held_to(server.answered(kubeapi.ROLES[kubeapi.KEDA_TOKEN][0]), ["keda"],
                   not_found={("get", "", "secrets"), ("get", "keda.sh", "triggerauthentications"),
                              ("get", "keda.sh", "scaledobjects")})


def test_keda_scales_a_machine_deployment_by_slurm_demand(cluster):
    """KEDA reading the objects keda.yml wrote (the test above)."""
    server, controllers, keda, _port = cluster
    api = server.api()
    runners = (controllers, keda)

    # ---- a held job, a dependent one, one of another partition and one done: no demand, nothing made
    Slurmrestd.jobs = [job(1, "PENDING", reason="JobHeldUser"),
                       job(2, "PENDING", reason="Dependency", dependency="afterok:9(unfulfilled)"),
                       job(3, "PENDING", reason="None", dependency="afterok:9(unfulfilled)"),
                       job(4, "PENDING", nodes=2, reason="Resources", partition="gpu"),
                       job(5, "COMPLETED", nodes=3)]
    wait_for("the ScaledObject Ready", lambda: condition(scaled_object(api), "Ready").get("status") == "True", runners)
    # the renewed token reaches KEDA: a request with the first one is refused, and KEDA builds its scaler again
    # (reading the Secret again) on that error
    wait_for("KEDA asking slurmrestd with the renewed token", lambda: Slurmrestd.asked[-2:] == ["answered"] * 2,
             runners, timeout=90)
    since = len(Slurmrestd.asked)
    assert demand(keda, api) == "0"
    assert condition(scaled_object(api), "Active").get("status") == "False"
    asked = len(Slurmrestd.asked)
    wait_for("two polling intervals more", lambda: len(Slurmrestd.asked) >= asked + 2, runners, timeout=60)
    assert replicas(api) == 0 and not api.list(CAPI, "machines", NS)
    assert "refused" not in Slurmrestd.asked[since:]

    # ---- a running job (1 node), a pending 2-node job and the held one: 3 nodes demanded, 0 -> 3
    Slurmrestd.jobs = [job(6, "RUNNING"), job(7, "PENDING", nodes=2, reason="Resources"),
                       job(1, "PENDING", reason="JobHeldUser")]
    started = time.monotonic()
    wait_for("the MachineDeployment at 3", lambda: replicas(api) == MAX, runners, timeout=120)
    scaled_in = time.monotonic() - started
    wait_for("three Machines Provisioned", lambda: provisioned_machines(api, NS, MAX), runners, timeout=240)
    provisioned_in = time.monotonic() - started
    assert demand(keda, api) == str(MAX)
    assert condition(scaled_object(api), "Active").get("status") == "True"
    hpa = api.get("autoscaling/v2", "horizontalpodautoscalers", NS, "keda-hpa-" + MD)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": CAPI, "kind": "MachineDeployment", "name": MD}
    assert set(host_states(api, NS).values()) == {"provisioned"}

    # ---- the queue empties: back to 0 after the cooldown, the hosts given back
    Slurmrestd.jobs = [job(6, "COMPLETED"), job(7, "COMPLETED", nodes=2)]
    emptied = time.monotonic()
    wait_for("the MachineDeployment at 0", lambda: replicas(api) == 0, runners, timeout=180)
    zero_in = time.monotonic() - emptied
    assert zero_in >= COOLDOWN - POLLING  # not before KEDA's cooldown
    wait_for("the Machines gone", lambda: not api.list(CAPI, "machines", NS), runners, timeout=240)
    wait_for("the hosts available again", lambda: set(host_states(api, NS).values()) == {"available"}, runners)
    figures = ("KEDA (polling %d s, cooldown %d s, HPA sync 15 s): 0 -> %d replicas %.1f s after the demand appeared, "
               "%d Machines Provisioned at %.1f s; back to 0 replicas %.1f s after the queue emptied"
               % (POLLING, COOLDOWN, MAX, scaled_in, MAX, provisioned_in, zero_in))
    print(figures)
    os.makedirs(os.path.join(REPO, ".lab", "logs"), exist_ok=True)
    with open(os.path.join(REPO, ".lab", "logs", "kube-keda-figures.tsv"), "a") as fh:
        fh.write("%s\t%s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), figures))
