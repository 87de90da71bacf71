"""The requests move.yml and rebalance.yml make that no other playbook makes, run as they run them against a
real kube-apiserver and read back from the server: the move's note written on the target MachineDeployment
and taken off again (tasks/move_note.yml, a merge patch whose null removes the key, the other annotations
kept), a host labelled for the target (tasks/move_label.yml, its other labels kept, a second run changes
nothing), the pool read as move.yml reads it (converged.hpc.pool_info), and the workload cluster's Pods and
Nodes read as rebalance.yml reads them."""

import json

from conftest import ADMIN_TOKEN, REPO, load_metal3
from test_kube_lifecycle_writes import inventory, playbook

API = "cluster.x-k8s.io/v1beta2"
INTENT = "converged.hpc/move"
NOTE = {"from": "hpc-gpu", "to": "hpc-compute", "hosts": ["hpc-cn-05"], "source": {"replicas": 1, "desired": 0},
        "target": {"replicas": 4, "desired": 5}}

PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml, {repo}/playbooks/vars/move.yml]
  tasks:
    - name: The move's note, as move.yml writes it (or takes it off)
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/move_note.yml
      vars:
        move_note: "{{{{ note | default(none) }}}}"
        move_note_target: hpc-compute
        move_note_namespace: {ns}
        move_note_api_version: {api}

    - name: A host given to the target, as move.yml labels it
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/move_label.yml
      vars:
        move_label_side: hpc-compute
        move_label_namespace: {ns}
        move_label_hosts: [hpc-cn-05]

    - name: The pool, as move.yml reads it (in Ansible's process)
      converged.hpc.pool_info:
        namespace: {ns}
      register: pool

    - name: Its compute Machines only, as move.yml waits for a target's
      converged.hpc.pool_info:
        namespace: {ns}
        kinds: [machines]
        machine_selector: cluster.x-k8s.io/deployment-name=hpc-compute
      register: compute

    - name: The workload cluster's Pods, as rebalance.yml reads them
      kubernetes.core.k8s_info:
        kind: Pod
      register: pods

    - name: And its Nodes
      kubernetes.core.k8s_info:
        kind: Node
      register: nodes

    - name: Say what was read
      ansible.builtin.debug:
        msg: >-
          pods {{{{ pods.resources | length }}}}, nodes {{{{ nodes.resources | length }}}}; pool
          {{{{ pool.deployments | map(attribute='metadata.name') | sort | join(',') }}}} templates
          {{{{ pool.templates | length }}}} hosts {{{{ pool.hosts | length }}}} machines {{{{ pool.machines | length }}}}
          compute {{{{ compute.machines | length }}}} {{{{ compute.keys() | sort | join(',') }}}}
          managedFields {{{{ pool.machines | selectattr('metadata.managedFields', 'defined') | list | length }}}}
"""


def test_the_note_and_the_label_on_a_real_server(kube, kube_ns, tmp_path):
    api = kube.api()
    load_metal3(api, kube_ns)
    api.patch(API, "machinedeployments", kube_ns, "hpc-compute", {"metadata": {"annotations": {"site/owner": "hpc"}}})
    inv = inventory(kube, kube_ns, tmp_path)
    play = PLAY.format(repo=REPO, ns=kube_ns, api=API)
    (tmp_path / "note.json").write_text(json.dumps({"note": NOTE}))
    proc = playbook(kube, tmp_path, inv, play, "-e", "@" + str(tmp_path / "note.json"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "pods 0, nodes 0" in proc.stdout
    # the fixture's 8 Machines (6 compute), their hosts; no Metal3MachineTemplate CRD on this server: none;
    # asked for the compute Machines, only those
    assert "pool hpc-compute,hpc-controller templates 0 hosts 8 machines 8 compute 6 changed,failed,machines" \
        in proc.stdout, proc.stdout[-3000:]
    assert "managedFields 0" in proc.stdout
    md = api.get(API, "machinedeployments", kube_ns, "hpc-compute")
    assert json.loads(md["metadata"]["annotations"][INTENT]) == NOTE
    assert md["metadata"]["annotations"]["site/owner"] == "hpc"
    host = api.get("metal3.io/v1alpha1", "baremetalhosts", kube_ns, "hpc-cn-05")
    assert host["metadata"]["labels"] == {"node-type": "compute", "rack": "r12", "converged.hpc/pool": "hpc-compute"}
    labelled = host["metadata"]["resourceVersion"]
    # the move done: the note taken off, nothing else; the host already labelled is not written again
    proc = playbook(kube, tmp_path, inv, play)
    assert proc.returncode == 0, proc.stdout[-3000:]
    md = api.get(API, "machinedeployments", kube_ns, "hpc-compute")
    assert INTENT not in md["metadata"]["annotations"] and md["metadata"]["annotations"]["site/owner"] == "hpc"
    assert api.get("metal3.io/v1alpha1", "baremetalhosts", kube_ns, "hpc-cn-05")["metadata"]["resourceVersion"] \
        == labelled
    assert ADMIN_TOKEN not in proc.stdout
