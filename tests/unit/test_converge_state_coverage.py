"""site.yml's fast path sees every file a role writes: each destination of a template, copy, file,
lineinfile or blockinfile task in the roles, with the roles' defaults and OS variables (both
families), lies under a tree or a stat-only path of playbooks/vars/converge_state.yml, and each
service a role starts is one of its units. A role that writes somewhere new fails here until the
list covers it."""

import glob
import os

import jinja2
import pytest
import yaml

from conftest import REPO

WRITERS = {"template": "dest", "copy": "dest", "file": "path", "lineinfile": "path", "blockinfile": "path"}
SERVICES = ("service", "systemd", "systemd_service")
# written on the Ansible controller, or removed rather than written
LOCAL = ("localhost", "{{ munge_key_generate_host }}")


def _load(path):
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        return yaml.safe_load(fh) or {}


def role_vars(family):
    out = {}
    for role in sorted(glob.glob(os.path.join(REPO, "roles", "*"))):
        out.update(_load(os.path.join(role, "defaults", "main.yml")))
        out.update(_load(os.path.join(role, "vars", "main.yml")))
        out.update(_load(os.path.join(role, "vars", family + ".yml")))
    return out


def render(value, variables):
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["dirname"] = os.path.dirname
    env.filters["basename"] = os.path.basename
    for _attempt in range(5):
        if not isinstance(value, str) or "{{" not in value:
            return value
        value = env.from_string(value).render(**variables)
        if value.startswith("["):
            value = yaml.safe_load(value)
    return value


def tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always"):
            yield from tasks(node.get(key))


def module_of(task):
    for key in task:
        short = key.rsplit(".", 1)[-1]
        if key.startswith(("ansible.builtin.", "ansible.posix.", "community.general.")) and isinstance(task[key], dict):
            return short, task[key]
    return None, None


def role_writes():
    """(role file, module, destination or service name) for every write and service task in the roles."""
    for path in sorted(glob.glob(os.path.join(REPO, "roles", "*", "*", "*.yml"))):
        if os.path.basename(os.path.dirname(path)) not in ("tasks", "handlers"):
            continue
        for task in tasks(_load(path) or []):
            module, args = module_of(task)
            if task.get("delegate_to") in LOCAL or (args or {}).get("state") == "absent":
                continue
            if module in WRITERS and args.get(WRITERS[module]):
                yield os.path.relpath(path, REPO), module, args[WRITERS[module]]
            elif module in SERVICES and args.get("name"):
                yield os.path.relpath(path, REPO), module, args["name"]


@pytest.mark.parametrize("family", ["Debian", "RedHat"])
def test_every_file_a_role_writes_is_fingerprinted(family):
    variables = role_vars(family)
    spec = _load(os.path.join(REPO, "playbooks", "vars", "converge_state.yml"))
    trees = [render(t, variables) for t in spec["_converged_state_trees"]]
    stat_only = render(spec["_converged_state_stat_only"], variables)
    assert all(os.path.isabs(p) for p in trees + stat_only), trees + stat_only
    missing, checked = [], 0
    for where, module, dest in role_writes():
        if module in SERVICES or "item" in dest:
            continue  # loops: the export and mount lists, and the directories below
        path = render(dest, variables).rstrip("/")
        checked += 1
        if not any(path == t or path.startswith(t.rstrip("/") + "/") for t in trees) and path not in stat_only:
            missing.append("%s: %s %s" % (where, module, path))
    assert checked > 20
    assert not missing, missing


def test_loop_directories_are_stat_only():
    variables = role_vars("Debian")
    spec = _load(os.path.join(REPO, "playbooks", "vars", "converge_state.yml"))
    stat_only = render(spec["_converged_state_stat_only"], variables)
    for path in ("/var/log/slurm", "/var/spool/slurmctld", "/var/spool/slurmd", "/home", "/srv/slurm-state"):
        assert path in stat_only


def test_every_service_a_role_runs_is_a_unit():
    variables = role_vars("Debian")
    spec = _load(os.path.join(REPO, "playbooks", "vars", "converge_state.yml"))
    units = [render(u, variables) for u in spec["_converged_state_units"]]
    services = set()
    for _where, module, name in role_writes():
        if module in SERVICES and "item" not in name:
            value = render(name, variables)
            services.update(value if isinstance(value, list) else [value])
    services.discard("")
    assert services and services <= set(units), sorted(services - set(units))
