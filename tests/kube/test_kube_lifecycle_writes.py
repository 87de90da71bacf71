"""What the lifecycle playbooks write to the management cluster, run as they run it against a real
kube-apiserver, through the real inventory, and read back from the server: the deletion hook put by
scale-up (tasks/hold_machine.yml) and released by scale-down (tasks/release_machine.yml, a refused
release named with the state it leaves), and join at boot's cloud-config Secrets (written, a second
run writes nothing, check mode is a dry run)."""

import base64
import json
import os
import subprocess

import yaml

from conftest import ADMIN_TOKEN, HOOK, READONLY_TOKEN, REPO, ansible_env, load_metal3, make_machine

API = "cluster.x-k8s.io/v1beta2"
KEY = base64.b64encode(bytes(range(128))).decode()


def inventory(kube, ns, tmp_path):
    path = tmp_path / "mgmt.capi_machines.yml"
    path.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "namespaces": [ns], "host": kube.url,
                                    "api_key": ADMIN_TOKEN, "ca_cert": kube.ca_cert}))
    return str(path)


def playbook(kube, tmp_path, inventory_path, play, *args, token=ADMIN_TOKEN):
    path = tmp_path / "play.yml"
    path.write_text(play)
    env = ansible_env(K8S_AUTH_HOST=kube.url, K8S_AUTH_API_KEY=token, K8S_AUTH_SSL_CA_CERT=kube.ca_cert)
    proc = subprocess.run(["ansible-playbook", "-i", inventory_path, str(path)] + list(args), cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=300)
    assert ADMIN_TOKEN not in proc.stdout + proc.stderr and READONLY_TOKEN not in proc.stdout + proc.stderr
    return proc


HOOK_PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml]
  tasks:
    - name: Hold the Machines as scale_up.yml does (once, from the control node)
      ansible.builtin.import_tasks: {repo}/playbooks/tasks/hold_machine.yml
      vars:
        hold_machine_hosts: >-
          {{{{ groups['compute'] | default([]) | map('extract', hostvars) | rejectattr('capi.deleting')
             | map(attribute='inventory_hostname') | list }}}}

    - name: Say which Machines could not be held
      ansible.builtin.debug:
        msg: "not held: {{{{ hold_machine_errors | join('; ') or 'none' }}}}"

- hosts: capi_deleting
  gather_facts: false
  vars_files: [{repo}/playbooks/vars/lifecycle.yml]
  tasks:
    - name: Release a leaving Machine as scale_down.yml does
      ansible.builtin.include_tasks: {repo}/playbooks/tasks/release_machine.yml
      vars:
        scale_down_done: its node is out of Slurm
"""


def annotations(kube, ns, name):
    return kube.api().get(API, "machines", ns, name)["metadata"].get("annotations") or {}


def test_the_hook_is_put_and_released_as_the_lifecycle_playbooks_do(kube, kube_ns, tmp_path):
    api = kube.api()
    make_machine(api, kube_ns, "cn-new", hooked=False)
    make_machine(api, kube_ns, "cn-leaving")
    api.delete(API, "machines", kube_ns, "cn-leaving")  # Cluster API deletes it; the hook holds it
    api.patch(API, "machines", kube_ns, "cn-leaving", {"metadata": {"annotations": {"site.example/owner": "hpc"}}})
    inv = inventory(kube, kube_ns, tmp_path)
    # with a token that may only read Machines: the release is refused, and the run says what is left to do
    proc = playbook(kube, tmp_path, inv, HOOK_PLAY.format(repo=REPO), token=READONLY_TOKEN)
    assert proc.returncode != 0 and "Machine %s/cn-leaving: its node is out of Slurm, but the hook %s could not be " \
        "released" % (kube_ns, HOOK) in proc.stdout.replace("\n", " "), proc.stdout[-3000:]
    assert "403" in proc.stdout and HOOK in annotations(kube, kube_ns, "cn-leaving")
    assert HOOK not in annotations(kube, kube_ns, "cn-new") and "not held: cn-new: " in proc.stdout
    # with the rights: held, released (only our annotation), the Machine left to Cluster API
    proc = playbook(kube, tmp_path, inv, HOOK_PLAY.format(repo=REPO))
    assert proc.returncode == 0 and "not held: none" in proc.stdout, proc.stdout[-3000:]
    assert annotations(kube, kube_ns, "cn-new")[HOOK] == "converged-hpc"
    leaving = api.get(API, "machines", kube_ns, "cn-leaving")
    assert leaving["metadata"]["annotations"] == {"site.example/owner": "hpc"} and leaving["metadata"]["deletionTimestamp"]
    assert leaving["metadata"]["finalizers"] == ["machine.cluster.x-k8s.io"]  # Cluster API's to remove
    again = playbook(kube, tmp_path, inv, HOOK_PLAY.format(repo=REPO))
    assert again.returncode == 0 and "changed=0" in again.stdout.split("PLAY RECAP")[-1], again.stdout[-2000:]


def join_at_boot(kube, tmp_path, inv, key, *args):
    # the controllers' Slurm given: their fixture addresses are never contacted
    extra = {"converged_join_at_boot": ["hpc-compute"], "munge_key": key, "munge_key_source": "variable",
             "converged_nfs": False, "converged_join_at_boot_slurm_version": "24.11.5"}
    path = tmp_path / "extra.json"
    path.write_text(json.dumps(extra))
    env = ansible_env(K8S_AUTH_HOST=kube.url, K8S_AUTH_API_KEY=ADMIN_TOKEN, K8S_AUTH_SSL_CA_CERT=kube.ca_cert)
    proc = subprocess.run(["ansible-playbook", "-i", inv, os.path.join(REPO, "playbooks", "join_at_boot.yml"),
                           "-e", "@" + str(path)] + list(args), cwd=REPO, env=env, capture_output=True, text=True,
                          check=False, timeout=300)
    assert key not in proc.stdout + proc.stderr and ADMIN_TOKEN not in proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout.split("PLAY RECAP")[-1]


def test_join_at_boot_secrets_written_once_and_check_mode_is_a_dry_run(kube, kube_ns, tmp_path):
    api = kube.api()
    load_metal3(api, kube_ns)
    api.patch(API, "machinedeployments", kube_ns, "hpc-compute",
              {"spec": {"template": {"metadata": {"annotations": {HOOK: "converged-hpc"}}}}})
    inv = inventory(kube, kube_ns, tmp_path)
    recap = join_at_boot(kube, tmp_path, inv, KEY)
    assert "localhost                  : ok" in recap and "changed=1" in recap.split("localhost")[1], recap
    secret = api.get("v1", "secrets", kube_ns, "hpc-compute-join")
    assert secret["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "converged.hpc"
    assert base64.b64decode(secret["data"]["format"]) == b"cloud-config"
    cloud_config = base64.b64decode(secret["data"]["value"]).decode()
    assert cloud_config.startswith("#cloud-config") and KEY.replace("\n", "") in cloud_config.replace("\n", "")
    # slurmd's drop-in runs the ready script, written executable (a waiting job starts once the node is IDLE)
    files = {f["path"]: f for f in yaml.safe_load(cloud_config)["write_files"]}
    ready = files["/usr/local/libexec/converged-hpc/slurmd-ready"]
    assert ready["permissions"] == "0755" and "scontrol update partitionname=" in ready["content"], ready
    assert "ExecStartPost=-/usr/local/libexec/converged-hpc/slurmd-ready" in \
        files["/etc/systemd/system/slurmd.service.d/converged-hpc.conf"]["content"]
    written = secret["metadata"]["resourceVersion"]
    # the same inputs again: nothing written
    recap = join_at_boot(kube, tmp_path, inv, KEY)
    assert "changed=0" in recap.split("localhost")[1], recap
    assert api.get("v1", "secrets", kube_ns, "hpc-compute-join")["metadata"]["resourceVersion"] == written
    # another munge key in check mode: reported, sent as a dry run, nothing stored
    other = base64.b64encode(bytes(range(128, 256))).decode()
    recap = join_at_boot(kube, tmp_path, inv, other, "--check")
    assert "changed=1" in recap.split("localhost")[1], recap
    assert api.get("v1", "secrets", kube_ns, "hpc-compute-join")["metadata"]["resourceVersion"] == written
