"""What a Machine carries is data, never a template: anyone who may write a Machine's annotations (or a
BareMetalHost's) must not run code where the playbooks run. ansible-core 2.19 treats every value an
inventory plugin gives as untrusted; before 2.19 a value is templated when a task reads it, unless the
plugin marks it unsafe, which capi_machines does for every value (tests/matrix.sh runs this on 2.16-2.18)."""

import os
import subprocess

import yaml

from conftest import ADMIN_TOKEN, CAPI_G, CAPI_V, ansible_env, load_metal3

PLAY = """
- hosts: compute
  gather_facts: false
  tasks:
    - name: What the annotation says
      ansible.builtin.debug:
        msg: "NOTE={{ capi.annotations['site.example/note'] }} END"
    - name: Read through a fact and a template too
      ansible.builtin.set_fact:
        note_copy: "{{ capi.annotations['site.example/note'] }}"
    - name: The copy
      ansible.builtin.debug:
        msg: "COPY={{ note_copy }} END"
"""


def test_a_template_in_a_machine_annotation_is_never_run(kube, kube_ns, tmp_path):
    api = kube.api()
    load_metal3(api, kube_ns)
    proof = tmp_path / "ran"
    note = "{{ lookup('ansible.builtin.pipe', 'touch %s') }}{{ 6 * 7 }}" % proof
    machine = next(m for m in api.list(CAPI_G + "/" + CAPI_V, "machines", kube_ns)
                   if (m["metadata"].get("labels") or {}).get("node-type") == "compute" and not
                   m["metadata"].get("deletionTimestamp"))
    api.patch(CAPI_G + "/" + CAPI_V, "machines", kube_ns, machine["metadata"]["name"],
              {"metadata": {"annotations": {"site.example/note": note}}})
    config = tmp_path / "test.capi_machines.yml"
    config.write_text(yaml.safe_dump({"plugin": "converged.hpc.capi_machines", "namespaces": [kube_ns],
                                      "host": kube.url, "api_key": ADMIN_TOKEN, "ca_cert": kube.ca_cert}))
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    proc = subprocess.run(["ansible-playbook", "-i", str(config), str(play), "-c", "local",
                           "--limit", machine["metadata"]["name"]],
                          capture_output=True, text=True, env=ansible_env(), cwd=str(tmp_path), timeout=300, check=False)
    assert not os.path.exists(proof), "a Machine's annotation ran a command where the playbook runs"
    out = " ".join(proc.stdout.split())
    assert "NOTE=%s END" % note in out and "COPY=%s END" % note in out, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "42" not in out.split("NOTE=")[1].split(" END")[0]
