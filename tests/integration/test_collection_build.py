"""ansible-galaxy collection build, then install of the tarball: plugins and roles resolve by FQCN."""

import os
import subprocess

from conftest import REPO, ansible_env


def test_build_and_install_tarball(tmp_path):
    out = tmp_path / "dist"
    subprocess.run(["ansible-galaxy", "collection", "build", "--output-path", str(out), REPO],
                   check=True, capture_output=True, text=True, env=ansible_env())
    tarballs = list(out.glob("converged-hpc-*.tar.gz"))
    assert [t.name for t in tarballs] == ["converged-hpc-0.1.0.tar.gz"]
    listing = subprocess.run(["tar", "-tzf", str(tarballs[0])], check=True, capture_output=True,
                             text=True).stdout.split()
    assert "plugins/inventory/capi_machines.py" in listing
    # the collection only: no lab, benchmarks, tests or development set-up
    top = {name.split("/")[0] for name in listing}
    assert top == {"MANIFEST.json", "FILES.json", "README.md", "LICENSE", "changelogs", "docs", "extensions",
                   "inventories", "meta", "playbooks", "plugins", "roles", "requirements.txt"}, sorted(top)
    assert "extensions/eda/plugins/event_source/capi_machines.py" in listing  # where ansible-rulebook looks
    dest = tmp_path / "collections"
    subprocess.run(["ansible-galaxy", "collection", "install", "--offline", "--no-deps", "--force", "-p", str(dest),
                    str(tarballs[0])], check=True, capture_output=True, text=True, env=ansible_env())
    env = ansible_env(ANSIBLE_COLLECTIONS_PATH=str(dest))
    doc = subprocess.run(["ansible-doc", "-t", "inventory", "converged.hpc.capi_machines"],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), check=False)
    assert doc.returncode == 0, doc.stderr
    assert "node_type_label" in doc.stdout and str(dest) in doc.stdout
    installed = dest / "ansible_collections" / "converged" / "hpc" / "roles"
    ours = os.path.join(REPO, "roles")
    assert sorted(os.listdir(installed) if installed.exists() else []) == \
        sorted(os.listdir(ours) if os.path.isdir(ours) else [])
