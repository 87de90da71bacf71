"""Every collection the roles, playbooks and rulebooks use is one the execution environment installs
(execution-environment.yml) and one the collection depends on (galaxy.yml): an AWX job in an EE built
from this repository never meets a module, lookup, filter, role or event source it does not have.

What is read: task keys and module_defaults groups, include_role/import_role names, rulebook sources
and run_playbook/run_module actions, and in every string (Jinja included, templates too) lookup(),
query(), filters and tests named by their FQCN."""

import glob
import os
import re

import pytest
import yaml

from conftest import REPO

FQCN = r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*"
IN_STRINGS = [re.compile(r"\b(?:lookup|query|q)\(\s*['\"](%s)['\"]" % FQCN),
              re.compile(r"\|\s*(%s)\b" % FQCN),
              re.compile(r"\bis\s+(?:not\s+)?(%s)\b" % FQCN)]
WHOLE = re.compile(r"^(?:group/)?(%s)$" % FQCN)
BUILT_IN = {"ansible.builtin", "ansible.legacy", "converged.hpc"}
# used only by awx_configure.yml, run from a workstation to configure AWX: in the EE, not a dependency
ADMIN_ONLY = {"awx.awx"}
# used only where the control node has it, chosen at run time (converged.hpc.first_module) over the dependency
# beside it: in the EE, not a dependency ({optional: its fallback})
OPTIONAL = {"ansible.mariadb": "community.mysql"}


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!unsafe", lambda loader, node: loader.construct_scalar(node))
_Loader.add_constructor("!vault", lambda loader, node: "")


def _walk(node, found, where, parent_key=None):
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and WHOLE.match(key):
                found.setdefault(WHOLE.match(key).group(1), set()).add(where)
            if str(key).rsplit(".", maxsplit=1)[-1] in ("include_role", "import_role") and isinstance(value, dict):
                name = value.get("name", "")
                if isinstance(name, str) and WHOLE.match(name):
                    found.setdefault(name, set()).add(where)
            if key == "roles" and isinstance(value, list):  # a play's roles: names, or {role: name}
                for role in value:
                    name = role.get("role", role.get("name", "")) if isinstance(role, dict) else role
                    if isinstance(name, str) and WHOLE.match(name):
                        found.setdefault(name, set()).add(where)
            if key in ("run_playbook", "run_module") and isinstance(value, dict):
                name = value.get("name", "")
                if isinstance(name, str) and WHOLE.match(name):
                    found.setdefault(name, set()).add(where)
            if key == "module_defaults" and isinstance(value, dict):
                for group in value:
                    if WHOLE.match(str(group)):
                        found.setdefault(WHOLE.match(group).group(1), set()).add(where)
            _walk(value, found, where, key)
    elif isinstance(node, list):
        for item in node:
            _walk(item, found, where, parent_key)
    elif isinstance(node, str):
        _strings(node, found, where)


def _strings(text, found, where):
    for pattern in IN_STRINGS:
        for name in pattern.findall(text):
            found.setdefault(name, set()).add(where)


def used():
    """{FQCN: {files}} of everything the roles, playbooks and rulebooks use."""
    found = {}
    files = [f for f in glob.glob(os.path.join(REPO, "roles", "*", "*", "*.yml"))
             if os.sep + "meta" + os.sep not in f]  # meta: argument specs and galaxy info, prose
    files += glob.glob(os.path.join(REPO, "playbooks", "**", "*.yml"), recursive=True)
    files += glob.glob(os.path.join(REPO, "extensions", "eda", "rulebooks", "*.yml"))
    for path in files:
        where = os.path.relpath(path, REPO)
        with open(path) as fh:
            for doc in yaml.load_all(fh, Loader=_Loader):  # noqa: S506 - a SafeLoader that knows !unsafe
                _walk(doc, found, where)
    for path in glob.glob(os.path.join(REPO, "roles", "*", "templates", "**", "*.j2"), recursive=True):
        with open(path) as fh:
            _strings(fh.read(), found, os.path.relpath(path, REPO))
    return found


def collections(found):
    out = {}
    for name, where in found.items():
        out.setdefault(".".join(name.split(".")[:2]), set()).update(where)
    return {k: v for k, v in out.items() if k not in BUILT_IN}


EE = os.path.join(REPO, "execution-environment.yml")


def missing_from_ee(path=EE):
    """{collection: [files using it]} for each collection used that the EE definition at path lacks."""
    with open(path) as fh:
        ee = yaml.safe_load(fh)
    installed = {c["name"] for c in ee["dependencies"]["galaxy"]["collections"] if c.get("type") != "file"}
    return {name: sorted(where) for name, where in collections(used()).items() if name not in installed}


def test_the_scan_finds_what_is_there():
    found = used()
    # one of each way in: a task key, a module_defaults group, a role, a lookup, a filter, a rulebook source
    assert "community.mysql.mysql_db" in found and "kubernetes.core.k8s_info" in found
    assert "ansible.mariadb.mariadb_db" in found
    assert "converged.hpc.slurm_compute" in found and "converged.hpc.capi_machines" in found
    assert any(name.startswith("ansible.utils.") for name in found)


def test_every_collection_used_is_in_the_execution_environment():
    missing = missing_from_ee()
    assert not missing, "execution-environment.yml lacks collections the content uses: %s" % missing


def test_every_collection_a_job_uses_is_a_dependency_of_the_collection():
    with open(os.path.join(REPO, "galaxy.yml")) as fh:
        depends = set(yaml.safe_load(fh)["dependencies"])
    missing = {name: sorted(where) for name, where in collections(used()).items()
               if name not in depends and name not in ADMIN_ONLY and name not in OPTIONAL}
    assert not missing, "galaxy.yml does not depend on collections the content uses: %s" % missing
    assert set(OPTIONAL.values()) <= depends
    for name, fallback in OPTIONAL.items():  # every file using the optional one has a twin using its fallback
        twins = {where.replace("_mariadb.yml", "_mysql.yml") for where in collections(used()).get(name, ())}
        assert twins and twins <= collections(used())[fallback], (name, twins)
    admin_only = {name: where for name, where in collections(used()).items() if name in ADMIN_ONLY}
    assert all(where == {os.path.join("playbooks", "awx_configure.yml")} for where in admin_only.values()), admin_only


@pytest.mark.parametrize("name", ["community.mysql", "ansible.mariadb", "kubernetes.core"])
def test_a_collection_taken_out_of_the_ee_is_named_with_its_users(tmp_path, name):
    with open(EE) as fh:
        ee = yaml.safe_load(fh)
    ee["dependencies"]["galaxy"]["collections"] = [c for c in ee["dependencies"]["galaxy"]["collections"]
                                                   if c["name"] != name]
    fake = tmp_path / "execution-environment.yml"
    fake.write_text(yaml.safe_dump(ee))
    missing = missing_from_ee(str(fake))
    assert list(missing) == [name] and missing[name]
    if name == "community.mysql":
        assert missing[name] == ["roles/mariadb/tasks/databases_mysql.yml", "roles/slurmdbd/tasks/dump_mysql.yml"]
    if name == "ansible.mariadb":
        assert missing[name] == ["roles/mariadb/tasks/databases_mariadb.yml", "roles/slurmdbd/tasks/dump_mariadb.yml"]
