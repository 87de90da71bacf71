"""ansible-galaxy collection build, then install of the tarball: plugins and roles resolve by FQCN."""

import os
import shutil
import subprocess

import pytest
import yaml

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
                   "inventories", "meta", "playbooks", "plugins", "rbac", "roles", "requirements.txt"}, sorted(top)
    assert "rbac/inventory.yml" in listing  # the roles a site grants each part (docs/rbac.md)
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


@pytest.mark.skipif(not shutil.which("ansible-builder"), reason="needs ansible-builder")
def test_the_execution_environment_holds_the_collection_and_what_it_needs(tmp_path):
    # `make ee`'s steps up to the image build (the registries are out of reach): the tarball into
    # .lab/ee, ansible-builder's build context, then the galaxy stage's install of our collection
    work = tmp_path / "work"
    (work / ".lab" / "ee").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "execution-environment.yml"), work)
    shutil.copytree(os.path.join(REPO, "ee"), work / "ee")
    subprocess.run(["ansible-galaxy", "collection", "build", "--output-path", str(tmp_path), REPO],
                   check=True, capture_output=True, text=True, env=ansible_env())
    (tarball,) = tmp_path.glob("converged-hpc-*.tar.gz")
    shutil.copy(tarball, work / ".lab" / "ee" / "converged-hpc.tar.gz")
    context = tmp_path / "context"
    res = subprocess.run(["ansible-builder", "create", "-f", "execution-environment.yml", "-c", str(context)],
                         cwd=str(work), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    build = context / "_build"
    wanted = yaml.safe_load(open(os.path.join(REPO, "galaxy.yml")))["dependencies"]
    collections = yaml.safe_load((build / "requirements.yml").read_text())["collections"]
    assert set(wanted) <= {c["name"] for c in collections}  # every collection galaxy.yml depends on
    python = {line.split(">")[0].split("=")[0].strip() for line in (build / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert {"kubernetes", "netaddr", "PyYAML", "jinja2"} <= python
    (ours,) = [c for c in collections if c.get("type") == "file"]
    # the galaxy stage copies _build to /build: the path it installs from is the file in the context
    assert ours["name"].startswith("/build/")
    local = build / ours["name"][len("/build/"):]
    assert local.is_file()
    dest = tmp_path / "ee-collections"
    subprocess.run(["ansible-galaxy", "collection", "install", "--offline", "--no-deps", "--force", "-p", str(dest),
                    str(local)],
                   check=True, capture_output=True, text=True, env=ansible_env())
    assert (dest / "ansible_collections" / "converged" / "hpc" / "extensions" / "eda" / "rulebooks"
            / "reconcile_webhook.yml").is_file()
