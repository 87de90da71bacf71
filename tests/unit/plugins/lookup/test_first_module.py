"""converged.hpc.first_module and the roles' two paths for MariaDB's modules: the lookup names the first module
the control node has (not one reached only through a deprecation redirect), fails naming every candidate when none
is there, and the mariadb and slurmdbd roles' two task files do the same with one collection's modules each."""

import os
import subprocess

import pytest
import yaml
from ansible.errors import AnsibleLookupError

from conftest import REPO, ansible_env

from ansible_collections.converged.hpc.plugins.lookup import first_module

PAIRS = {"community.mysql.mysql_db": "ansible.mariadb.mariadb_db",
         "community.mysql.mysql_user": "ansible.mariadb.mariadb_user"}


def play(tmp_path, tasks, **variables):
    """Runs tasks on localhost through ansible-playbook (the plugin loader as a run has it); its stdout."""
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "vars": variables,
                                     "tasks": tasks}]))
    res = subprocess.run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(path)], capture_output=True,
                         text=True, env=ansible_env(), cwd=REPO, timeout=120, check=False)
    return res


def test_the_first_installed_module_is_chosen_and_a_missing_one_passed_over(tmp_path):
    res = play(tmp_path, [
        {"ansible.builtin.debug": {"msg": "first={{ lookup('converged.hpc.first_module', 'no_such.coll.mod', "
                                          "'ansible.builtin.copy', 'ansible.builtin.file') }}"}},
        {"ansible.builtin.debug": {"msg": "{{ lookup('converged.hpc.first_module', 'no_such.one.a', 'no_such.two.b') }}"},
         "ignore_errors": True}])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "first=ansible.builtin.copy" in res.stdout
    assert "none of these modules is installed on the control node: no_such.one.a, no_such.two.b" in res.stdout


def test_a_name_that_is_not_a_module_fqcn_is_refused_by_name():
    with pytest.raises(AnsibleLookupError, match="'mysql_db'"):
        first_module.LookupModule().run(["mysql_db"], variables={})


@pytest.mark.parametrize("role, stem", [("mariadb", "databases"), ("slurmdbd", "dump")])
def test_the_two_paths_are_the_same_tasks_with_one_collections_modules(role, stem):
    def tasks(name):
        with open(os.path.join(REPO, "roles", role, "tasks", "%s_%s.yml" % (stem, name))) as fh:
            return yaml.safe_load(fh)
    mysql, mariadb = tasks("mysql"), tasks("mariadb")
    assert mysql and len(mysql) == len(mariadb)
    for old, new in zip(mysql, mariadb):
        (module,) = [k for k in old if k in PAIRS]
        assert {k: v for k, v in old.items() if k != module} == {k: v for k, v in new.items() if k != PAIRS[module]}
        assert new[PAIRS[module]] == old[module]


def test_the_roles_choose_the_newest_installed_collection(tmp_path):
    # what __mariadb_modules and __slurmdbd_database_modules become on this control node, through a real play
    # (the two expressions as the roles' vars files have them; the files whole template more than these before 2.19)
    chosen = {}
    for role, name in (("mariadb", "__mariadb_modules"), ("slurmdbd", "__slurmdbd_database_modules")):
        with open(os.path.join(REPO, "roles", role, "vars", "main.yml")) as fh:
            chosen[name] = yaml.safe_load(fh)[name]
    tasks = [{"ansible.builtin.debug": {"msg": "chosen {{ __mariadb_modules }} {{ __slurmdbd_database_modules }}"}},
             {"ansible.builtin.debug": {"msg": "has {{ lookup('converged.hpc.first_module', "
                                               "'ansible.mariadb.mariadb_db', 'ansible.builtin.copy') }}"}},
             {"ansible.builtin.debug": {"msg": "named {{ __mariadb_modules }}"},
              "vars": {"mariadb_modules": "community.mysql"}}]
    res = play(tmp_path, tasks, mariadb_modules="auto", slurmdbd_database_modules="auto", **chosen)
    assert res.returncode == 0, res.stdout + res.stderr
    expected = "community.mysql" if "has ansible.builtin.copy" in res.stdout else "ansible.mariadb"
    assert "chosen %s %s" % (expected, expected) in res.stdout
    assert "named community.mysql" in res.stdout
