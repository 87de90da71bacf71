"""The collection's own Kubernetes roles (rbac/*.yml), each part run with a token that has exactly its role on
a real kube-apiserver, what it was answered read from the server's audit log: no request refused (a 403 is
a bug in the role or in the collection), and every rule of the role used by some request (a verb nothing
uses is one a site grants for nothing).

rbac/inventory.yml (converged-hpc-inventory): the inventory plugin, its Metal3 hosts included
(metal3=always), and the event source, its list and its watch. rbac/lifecycle.yml (converged-hpc-lifecycle,
with the inventory's role): what scale_up.yml, scale_down.yml and reconcile.yml do in the management
cluster, through their own task files: the run's Lease taken and given back, the munge key read from its
Secret, the hook put on a new Machine and released from a leaving one. rbac/autoscale.yml
(converged-hpc-autoscale, with the inventory's role): autoscale.yml's calls, its list of the cluster's
MachineDeployments and converged.hpc.capi_scale's scale-up and scale-down decisions (the rest of the run
reads Slurm, which a kube-apiserver alone does not have: the autoscale lab runs it whole). rbac/join_at_boot.yml
(converged-hpc-join-at-boot, with the inventory's role): join_at_boot.yml whole, its cloud-config Secret
written, then rewritten for another munge key. rbac/move.yml (converged-hpc-move, with the inventory's and
autoscale's roles) and rbac/workload_reader.yml: move.yml's and rebalance.yml's own tasks (the note on the
target, a host labelled for it, the pool read, the workload cluster's Pods and Nodes) on a server with the
controllers' own CRDs (Metal3MachineTemplates served); what a move runs besides (hook, Lease, /scale) is
the lifecycle and autoscale parts above. rbac/rollout.yml (converged-hpc-rollout, with the inventory's,
lifecycle's, autoscale's and move's roles): rollout.yml's own API tasks (the MachineDeployment, its MachineSets
and Machines read, the rollout written on it under the Lease, an old Machine deleted); draining and releasing
is the lifecycle part above, the rest reads Slurm (the rollout lab runs it whole)."""

import base64
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

import kubeapi
from conftest import AUTOSCALE_TOKEN, HOOK, INVENTORY_TOKEN, JOIN_TOKEN, LIFECYCLE_TOKEN, MOVE_TOKEN, REPO, ROLLOUT_TOKEN, \
    ansible_env, load_metal3, make_machine, reasons, recorded, run_source
from test_kube_lifecycle_writes import playbook
from test_kube_move import NOTE, PLAY as MOVE_PLAY

API = "cluster.x-k8s.io/v1beta2"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if kubeapi.assets()[1]:
        pytest.skip("real kube-apiserver tier skipped: " + kubeapi.assets()[1])
    with recorded(tmp_path_factory.mktemp("rbac-apiserver"), audit=True) as started:
        yield started


def rule_grants(rules):
    """Each (verb, API group, resource) a role's rules grant."""
    return {(verb, group, resource) for rule in rules for verb in rule["verbs"] for group in rule["apiGroups"]
            for resource in rule["resources"]}


def assert_held_to(answered, parts, not_found=()):
    """No request refused (a 404 only for the (verb, API group, resource) in not_found: a thing looked for
    before it is made), and every rule of each part's role (rbac/<part>.yml) used by some request."""
    refused = sorted({entry for entry in answered if entry[3] >= 400
                      and not (entry[3] == 404 and entry[:3] in not_found)})
    assert not refused, "refused with the collection's roles (%s): %s" % (", ".join(parts), refused)
    used = {(verb, group, resource) for verb, group, resource, _code in answered}
    for part in parts:
        unused = rule_grants(kubeapi.collection_role(part)) - used
        assert not unused, "granted by rbac/%s.yml but used by no request: %s" % (part, sorted(unused))


@pytest.fixture(scope="module")
def inventory_part(server, tmp_path_factory):
    """The inventory (every namespace, the hosts required) and the event source (one namespace: its list,
    then a Machine that comes up seen through its watch), both with the inventory role's token."""
    tmp = tmp_path_factory.mktemp("inventory-part")
    config = tmp / "mgmt.capi_machines.yml"
    config.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "host": server.url,
                                      "api_key": INVENTORY_TOKEN, "ca_cert": server.ca_cert, "metal3": "always"}))
    listed = subprocess.run(["ansible-inventory", "-i", str(config), "--list"], capture_output=True, text=True,
                            env=ansible_env(), cwd=str(tmp), timeout=120, check=False)
    api = server.api()
    api.namespace("rbac-events")
    make_machine(api, "rbac-events", "cn-1")
    args = {"host": server.url, "api_key": INVENTORY_TOKEN, "ca_cert": server.ca_cert,
            "namespaces": ["rbac-events"], "window": 0.5, "timeout": 5}
    thread, out, result = run_source(args, lambda ev: len(ev) >= 2, timeout=40)
    deadline = time.monotonic() + 15
    while not out.events and time.monotonic() < deadline:
        time.sleep(0.05)
    make_machine(api, "rbac-events", "cn-2")
    thread.join(40)
    user = kubeapi.ROLES[INVENTORY_TOKEN][0]
    # a watch is logged when it ends (the source's was cut when it stopped): a moment for the last entry
    deadline = time.monotonic() + 15
    while not any(entry[0] == "watch" for entry in server.answered(user)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return listed, out.events, result, server.answered(user)


def test_the_inventory_lists_every_machine_and_its_host_with_the_inventory_role(inventory_part):
    listed, _events, _result, _answered = inventory_part
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "403" not in listed.stderr and INVENTORY_TOKEN not in listed.stdout + listed.stderr
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert hostvars and all("capi" in v for v in hostvars.values())
    # the Metal3 hosts were read (metal3=always fails the run when it cannot): their memory is on the hosts
    assert any(v["capi"].get("ram_mib") for v in hostvars.values()), listed.stdout[:2000]


def test_the_event_source_lists_then_watches_with_the_inventory_role(inventory_part):
    _listed, events, result, _answered = inventory_part
    assert reasons(events) == [(["initial"], ["cn-1"]), (["up"], ["cn-2"])], result


def test_the_inventory_role_is_all_used_and_never_refused(inventory_part):
    _listed, _events, _result, answered = inventory_part
    assert_held_to(answered, ["inventory"])


LIFECYCLE_PLAY = """
- name: The run's start, as the lifecycle playbooks begin
  hosts: localhost
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml]
  vars:
    converged_lease_namespace: {ns}
  tasks:
    - name: Take the run's Lease
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/lease.yml
      vars:
        lease_action: acquired

    - name: Read the munge key from its Secret, as the munge role's preflight does
      ansible.builtin.set_fact:
        munge_secret_found: "{{{{ lookup('converged.hpc.k8s_secret', 'munge-key', namespace='{ns}') | length > 0 }}}}"

    - name: Hold the new Machines, as scale_up.yml does
      ansible.builtin.import_tasks: {repo}/playbooks/tasks/hold_machine.yml
      vars:
        hold_machine_hosts: >-
          {{{{ groups['compute'] | default([]) | map('extract', hostvars) | rejectattr('capi.deleting')
             | map(attribute='inventory_hostname') | list }}}}

    - name: Say what was found and held
      ansible.builtin.debug:
        msg: "munge key Secret found: {{{{ munge_secret_found }}}}; not held: {{{{ hold_machine_errors | join('; ') or 'none' }}}}"

- name: The leaving Machines, as scale_down.yml ends
  hosts: capi_deleting
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml]
  tasks:
    - name: Release the hook
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/release_machine.yml
      vars:
        scale_down_done: its node is out of Slurm

- name: The run's end
  hosts: localhost
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml]
  vars:
    converged_lease_namespace: {ns}
  tasks:
    - name: Give the run's Lease back
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/lease.yml
      vars:
        lease_action: released
"""


@pytest.fixture(scope="module")
def lifecycle_part(server, tmp_path_factory):
    """The lifecycle playbooks' tasks run once with the lifecycle token (both roles), on a namespace holding a
    new Machine, a leaving one (deleted, held by our hook) and the munge key's Secret."""
    tmp = tmp_path_factory.mktemp("lifecycle-part")
    ns = "rbac-lifecycle"
    api = server.api()
    api.namespace(ns)
    make_machine(api, ns, "cn-new", hooked=False)
    make_machine(api, ns, "cn-leaving")
    api.delete(API, "machines", ns, "cn-leaving")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "munge-key"},
              "data": {"munge.key": "c2VjcmV0LWZvci10ZXN0cw=="}}
    api.ok("POST", "/api/v1/namespaces/%s/secrets" % ns, secret)
    config = tmp / "mgmt.capi_machines.yml"
    config.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "namespaces": [ns], "host": server.url,
                                      "api_key": LIFECYCLE_TOKEN, "ca_cert": server.ca_cert}))
    play = tmp / "lifecycle.yml"
    play.write_text(LIFECYCLE_PLAY.format(repo=REPO, ns=ns))
    env = ansible_env(K8S_AUTH_HOST=server.url, K8S_AUTH_API_KEY=LIFECYCLE_TOKEN, K8S_AUTH_SSL_CA_CERT=server.ca_cert)
    proc = subprocess.run(["ansible-playbook", "-i", str(config), str(play)], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False, timeout=300)
    machines = {name: api.get(API, "machines", ns, name) for name in ("cn-new", "cn-leaving")}
    lease = api.get("coordination.k8s.io/v1", "leases", ns, "converged-hpc")
    return proc, machines, lease, server.answered(kubeapi.ROLES[LIFECYCLE_TOKEN][0])


def test_the_lifecycle_tasks_do_their_work_with_the_lifecycle_role(lifecycle_part):
    proc, machines, lease, _answered = lifecycle_part
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert LIFECYCLE_TOKEN not in out and "c2VjcmV0LWZvci10ZXN0cw" not in out
    assert "munge key Secret found: True; not held: none" in proc.stdout, proc.stdout[-3000:]
    assert machines["cn-new"]["metadata"]["annotations"].get(HOOK) == "converged-hpc"
    assert HOOK not in (machines["cn-leaving"]["metadata"].get("annotations") or {})
    # given back: held by nobody
    assert lease and not (lease.get("spec") or {}).get("holderIdentity"), lease


def test_the_lifecycle_role_is_all_used_and_never_refused(lifecycle_part):
    _proc, _machines, _lease, answered = lifecycle_part
    assert_held_to(answered, ["lifecycle"], not_found={("get", "coordination.k8s.io", "leases")})


AUTOSCALE_PLAY = """
- name: autoscale.yml's calls to the management cluster
  hosts: localhost
  gather_facts: false
  tasks:
    - name: List the cluster's MachineDeployments, as autoscale.yml finds its pools
      kubernetes.core.k8s_info:
        api_version: cluster.x-k8s.io/v1beta2
        kind: MachineDeployment
        namespace: {ns}
        label_selectors: ["cluster.x-k8s.io/cluster-name=hpc"]
      register: autoscale_deployments

    - name: Grow hpc-compute by one (a scale-up decision)
      converged.hpc.capi_scale:
        name: hpc-compute
        namespace: {ns}
        current_replicas: 5
        replicas: 6
        delete_machines: []
        delete_reason: "converged.hpc autoscale: idle"
        annotations: {{"converged.hpc/scaled-up-at": "1764300000"}}

    - name: Shrink it by two idle Machines (a scale-down decision)
      converged.hpc.capi_scale:
        name: hpc-compute
        namespace: {ns}
        current_replicas: 6
        replicas: 4
        delete_machines: [hpc-compute-7d9f8-abcde, hpc-compute-7d9f8-fghij]
        delete_reason: "converged.hpc autoscale: idle"
        annotations: {{}}

    - name: Say which pools were found
      ansible.builtin.debug:
        msg: "pools: {{{{ autoscale_deployments.resources | map(attribute='metadata.name') | sort | join(',') }}}}"
"""


def local_play(server, tmp, ns, play, token):
    """play run on the control node alone with token, in namespace ns holding the recorded metal3 objects."""
    api = server.api()
    api.namespace(ns)
    load_metal3(api, ns)
    path = tmp / "play.yml"
    path.write_text(play)
    env = ansible_env(K8S_AUTH_HOST=server.url, K8S_AUTH_API_KEY=token, K8S_AUTH_SSL_CA_CERT=server.ca_cert)
    return subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=" + sys.executable, str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def autoscale_part(server, tmp_path_factory):
    """autoscale.yml's API tasks run once with the autoscale token (with the inventory's role), on the recorded
    MachineDeployment hpc-compute (5 replicas) in a namespace of its own."""
    api, ns = server.api(), "rbac-autoscale"
    proc = local_play(server, tmp_path_factory.mktemp("autoscale-part"), ns, AUTOSCALE_PLAY.format(ns=ns),
                      AUTOSCALE_TOKEN)
    scale = api.ok("GET", "/apis/%s/namespaces/%s/machinedeployments/hpc-compute/scale" % (API, ns))
    marked = sorted(m["metadata"]["name"] for m in api.list(API, "machines", ns)
                    if "cluster.x-k8s.io/delete-machine" in (m["metadata"].get("annotations") or {}))
    return proc, scale["spec"].get("replicas", 0), marked, server.answered(kubeapi.ROLES[AUTOSCALE_TOKEN][0])


def test_the_autoscale_decisions_are_made_with_the_autoscale_role(autoscale_part):
    proc, replicas, marked, _answered = autoscale_part
    assert proc.returncode == 0 and AUTOSCALE_TOKEN not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert "pools: hpc-compute" in proc.stdout
    assert replicas == 4 and marked == ["hpc-compute-7d9f8-abcde", "hpc-compute-7d9f8-fghij"]


def test_the_autoscale_role_is_all_used_and_never_refused(autoscale_part):
    _proc, _replicas, _marked, answered = autoscale_part
    assert_held_to(answered, ["autoscale"])


@pytest.fixture(scope="module")
def join_part(server, tmp_path_factory):
    """join_at_boot.yml run with the join token (with the inventory's role) for the recorded hpc-compute (our
    hook on its template), twice: its Secret written, then rewritten for another munge key. rbac/move.yml (converged-hpc-move, with the inventory's and
autoscale's roles) and rbac/workload_reader.yml: move.yml's and rebalance.yml's own tasks (the note on the
target, a host labelled for it, the pool read, the workload cluster's Pods and Nodes) on a server with the
controllers' own CRDs (Metal3MachineTemplates served); what a move runs besides (hook, Lease, /scale) is
the lifecycle and autoscale parts above."""
    tmp = tmp_path_factory.mktemp("join-part")
    api = server.api()
    ns = "rbac-join"
    api.namespace(ns)
    load_metal3(api, ns)
    api.patch(API, "machinedeployments", ns, "hpc-compute",
              {"spec": {"template": {"metadata": {"annotations": {HOOK: "converged-hpc"}}}}})
    config = tmp / "mgmt.capi_machines.yml"
    config.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "namespaces": [ns], "host": server.url,
                                      "api_key": JOIN_TOKEN, "ca_cert": server.ca_cert}))
    env = ansible_env(K8S_AUTH_HOST=server.url, K8S_AUTH_API_KEY=JOIN_TOKEN, K8S_AUTH_SSL_CA_CERT=server.ca_cert)
    runs, keys = [], []
    for first in (0, 128):
        key = base64.b64encode(bytes(range(first, first + 128))).decode()
        keys.append(key)
        # the controllers' Slurm given: their fixture addresses are never contacted
        extra = tmp / "extra.json"
        extra.write_text(json.dumps({"converged_join_at_boot": ["hpc-compute"], "munge_key": key,
                                     "munge_key_source": "variable", "converged_nfs": False,
                                     "converged_join_at_boot_slurm_version": "24.11.5"}))
        runs.append(subprocess.run(["ansible-playbook", "-i", str(config), os.path.join(REPO, "playbooks", "join_at_boot.yml"),
                                    "-e", "@" + str(extra)], cwd=REPO, env=env, capture_output=True, text=True,
                                   check=False, timeout=300))
    secret = api.get("v1", "secrets", ns, "hpc-compute-join")
    return runs, keys, secret, server.answered(kubeapi.ROLES[JOIN_TOKEN][0])


def test_join_at_boot_writes_its_secret_with_the_join_at_boot_role(join_part):
    runs, keys, secret, _answered = join_part
    for proc in runs:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        assert JOIN_TOKEN not in out and not any(key in out for key in keys)
        assert "changed=1" in proc.stdout.split("PLAY RECAP")[-1].split("localhost")[1], proc.stdout[-2000:]
    value = base64.b64decode(secret["data"]["value"]).decode().replace("\n", "")
    assert keys[1].replace("\n", "") in value and keys[0] not in value


def test_the_join_at_boot_role_is_all_used_and_never_refused(join_part):
    _runs, _keys, _secret, answered = join_part
    assert_held_to(answered, ["join_at_boot"], not_found={("get", "", "secrets")})


@pytest.fixture(scope="module")
def move_part(tmp_path_factory):
    """move.yml's and rebalance.yml's own tasks (tests/kube/test_kube_move.py's play: the note written, a host
    labelled, the pool read, Pods and Nodes read) run with the move token, on a server of their own with the
    controllers' CRDs and a Metal3MachineTemplate for hpc-compute."""
    if kubeapi.assets()[1]:
        pytest.skip("real kube-apiserver tier skipped: " + kubeapi.assets()[1])
    tmp = tmp_path_factory.mktemp("move-part")
    with recorded(tmp / "apiserver", audit=True, crds=kubeapi.module_crds()) as server:
        api = server.api()
        ns = "rbac-move"
        api.namespace(ns)
        load_metal3(api, ns)
        image = "http://images.lab.invalid/compute.qcow2"
        api.ok("POST", "/apis/infrastructure.cluster.x-k8s.io/v1beta2/namespaces/%s/metal3machinetemplates" % ns, {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta2", "kind": "Metal3MachineTemplate",
            "metadata": {"name": "hpc-compute"},
            "spec": {"template": {"spec": {
                "hostSelector": {"matchLabels": {"converged.hpc/pool": "hpc-compute"}},
                "image": {"url": image, "checksum": image + ".sha256sum", "checksumType": "sha256",
                          "diskFormat": "qcow2"}}}}})
        config = tmp / "mgmt.capi_machines.yml"
        config.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "namespaces": [ns],
                                          "host": server.url, "api_key": MOVE_TOKEN, "ca_cert": server.ca_cert}))
        (tmp / "note.json").write_text(json.dumps({"note": NOTE}))
        play = MOVE_PLAY.format(repo=REPO, ns=ns, api=API)
        runs = [playbook(server, tmp, str(config), play, "-e", "@" + str(tmp / "note.json"), token=MOVE_TOKEN),
                playbook(server, tmp, str(config), play, token=MOVE_TOKEN)]
        host = api.get("metal3.io/v1alpha1", "baremetalhosts", ns, "hpc-cn-05")
        yield runs, host, server.answered(kubeapi.ROLES[MOVE_TOKEN][0])


def test_the_move_tasks_do_their_work_with_the_move_roles(move_part):
    runs, host, _answered = move_part
    for proc in runs:
        assert proc.returncode == 0 and MOVE_TOKEN not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    # the pool read whole: its MachineDeployments, the template (served here), the hosts and Machines
    assert "pool hpc-compute,hpc-controller templates 1 hosts 8 machines 8" in runs[0].stdout, runs[0].stdout[-3000:]
    assert host["metadata"]["labels"]["converged.hpc/pool"] == "hpc-compute"


def test_the_move_roles_are_all_used_and_never_refused(move_part):
    _runs, _host, answered = move_part
    assert_held_to(answered, ["move", "workload_reader"])


ROLLOUT_PLAY = """
- name: rollout.yml's own calls to the management cluster
  hosts: localhost
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml, {repo}/playbooks/vars/move.yml, {repo}/playbooks/vars/rollout.yml]
  vars:
    converged_lease_namespace: {ns}
    converged_rollout_deployment: hpc-compute
    converged_move: {{namespace: {ns}}}
  tasks:
    - name: Read the MachineDeployment, its MachineSets and Machines, as each step does
      converged.hpc.pool_info:
        namespace: {ns}
        kinds: [deployments, machinesets, machines]
        machine_selector: cluster.x-k8s.io/deployment-name=hpc-compute
      register: rollout_pool

    - name: Write the rollout on it, its strategy and template
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/rollout_write.yml
      vars:
        rollout_write_note: {{state: running, from: {{template: hpc-compute}}, to: {{template: hpc-compute-v2}}}}
        rollout_write_template: {{template: hpc-compute-v2, bootstrap: hpc-compute}}

    - name: Delete an old Machine, as rollout_take.yml does once its node is drained and idle
      kubernetes.core.k8s:
        state: absent
        api_version: cluster.x-k8s.io/v1beta2
        kind: Machine
        name: hpc-compute-7d9f8-abcde
        namespace: {ns}
        wait: false

    - name: Say what was read
      ansible.builtin.debug:
        msg: "sets {{{{ rollout_pool.machinesets | length }}}} machines {{{{ rollout_pool.machines | length }}}}"
"""


@pytest.fixture(scope="module")
def rollout_part(server, tmp_path_factory):
    """rollout.yml's API tasks run once with the rollout token, on the recorded hpc-compute in a namespace of its own."""
    api, ns = server.api(), "rbac-rollout"
    proc = local_play(server, tmp_path_factory.mktemp("rollout-part"), ns, ROLLOUT_PLAY.format(repo=REPO, ns=ns),
                      ROLLOUT_TOKEN)
    md = api.get(API, "machinedeployments", ns, "hpc-compute")
    # deleted: gone, or held by its finalizer (what Cluster API's controller then works off)
    names = sorted(m["metadata"]["name"] for m in api.list(API, "machines", ns)
                   if not m["metadata"].get("deletionTimestamp"))
    return proc, md, names, server.answered(kubeapi.ROLES[ROLLOUT_TOKEN][0])


def test_the_rollout_tasks_do_their_work_with_the_rollout_roles(rollout_part):
    proc, md, names, _answered = rollout_part
    assert proc.returncode == 0 and ROLLOUT_TOKEN not in proc.stdout + proc.stderr, proc.stdout[-3000:]
    assert "sets 1 machines 6" in proc.stdout, proc.stdout[-3000:]
    assert json.loads(md["metadata"]["annotations"]["converged.hpc/rollout"])["state"] == "running"
    assert md["spec"]["rollout"]["strategy"]["type"] == "OnDelete"
    assert md["spec"]["template"]["spec"]["infrastructureRef"]["name"] == "hpc-compute-v2"
    assert "hpc-compute-7d9f8-abcde" not in names and "hpc-compute-7d9f8-fghij" in names


def test_the_rollout_role_is_all_used_and_never_refused(rollout_part):
    _proc, _md, _names, answered = rollout_part
    assert_held_to(answered, ["rollout"], not_found={("get", "coordination.k8s.io", "leases")})
