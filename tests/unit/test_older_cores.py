"""What ansible-core before 2.19 cannot run, found without running it: every conditional of the collection's
roles and playbooks (when, changed_when, failed_when, until, assert's that) compiles as those releases
template it, inside `{% if ... %}`, where Jinja takes no inline `x if y else z`. ansible-core 2.19 evaluates
a conditional as an expression and takes it; a site's execution environment on 2.16 to 2.18 fails the task.
The matrix (tests/matrix.sh) runs the rest on each release."""

import os
import re

import ansible.release
import jinja2
import pytest
import yaml

from conftest import REPO

CONDITIONALS = ("when", "changed_when", "failed_when", "until")
ASSERTS = ("assert", "ansible.builtin.assert")


class _Loader(yaml.SafeLoader):
    pass


# !unsafe, !vault: their text (never a conditional of ours)
_Loader.add_multi_constructor("!", lambda loader, _suffix, node: loader.construct_scalar(node)
                              if isinstance(node, yaml.ScalarNode) else None)


def conditionals(node, where):
    """(where, keyword, text) of every conditional under node."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in CONDITIONALS:
                for text in value if isinstance(value, list) else [value]:
                    yield where, key, text
            if key in ASSERTS and isinstance(value, dict):
                that = value.get("that", [])
                for text in that if isinstance(that, list) else [that]:
                    yield where, "that", text
            yield from conditionals(value, where)
    elif isinstance(node, list):
        for item in node:
            yield from conditionals(item, where)


def collection_conditionals():
    found = []
    for top in ("roles", "playbooks"):
        for root, _dirs, names in os.walk(os.path.join(REPO, top)):
            for name in sorted(names):
                if name.endswith((".yml", ".yaml")):
                    path = os.path.join(root, name)
                    with open(path) as fh:
                        data = yaml.load(fh, Loader=_Loader)  # noqa: S506 - a SafeLoader that reads tags as text
                    found += [c for c in conditionals(data, os.path.relpath(path, REPO))
                              if isinstance(c[2], str)]
    return found


CONDITIONALS_FOUND = collection_conditionals()


def test_the_collection_has_conditionals_to_check():
    assert len(CONDITIONALS_FOUND) > 300


def test_every_conditional_compiles_as_ansible_core_before_2_19_templates_it():
    env = jinja2.Environment()
    refused = []
    for where, key, text in CONDITIONALS_FOUND:
        try:  # ansible-core 2.16-2.18's Conditional: the text inside an {% if %}
            env.parse("{%% if %s %%} True {%% else %%} False {%% endif %%}" % text)
        except jinja2.TemplateSyntaxError as exc:
            refused.append("%s: %s: %r: %s" % (where, key, " ".join(text.split())[:120], exc))
    assert not refused, "\n".join(refused)


@pytest.mark.parametrize("text", ["a if b else c", "(x.exists and x.isreg) if src | length > 0 else y.exists"])
def test_the_construct_that_older_releases_refuse_is_found(text):
    with pytest.raises(jinja2.TemplateSyntaxError):
        jinja2.Environment().parse("{%% if %s %%} True {%% else %%} False {%% endif %%}" % text)


def test_the_releases_claimed_are_the_releases_tested():
    """meta/runtime.yml's range, the execution environment's and the matrix's releases agree: every release from
    the oldest claimed to the newest is tested (the matrix's and the test bed's own), requires_ansible ends
    after the newest tested, and the EE takes the tested releases its Python (3.11, AWX 24.6.1's base image)
    can install: up to 2.19 (2.20 and later need Python 3.12)."""
    with open(os.path.join(REPO, "meta", "runtime.yml")) as fh:
        found = re.search(r"requires_ansible:\s*[\"']?>=\s*2\.(\d+)\.0,<2\.(\d+)[\"']", fh.read())
    assert found, "meta/runtime.yml: requires_ansible should read \">=2.N.0,<2.M\""
    oldest, beyond = int(found.group(1)), int(found.group(2))
    with open(os.path.join(REPO, "execution-environment.yml")) as fh:
        core = yaml.safe_load(fh)["dependencies"]["ansible_core"]["package_pip"]
    with open(os.path.join(REPO, "tests", "matrix.sh")) as fh:
        matrix = re.search(r"versions=\(([0-9. ]+)\)", fh.read()).group(1).split()
    assert matrix[0] == "2.%d" % oldest
    if not os.environ.get("CONVERGED_MATRIX"):  # (in the matrix, this runs on another release)
        bed = int(ansible.release.__version__.split(".")[1])
        tested = sorted({int(v.split(".")[1]) for v in matrix} | {bed})
        assert tested == list(range(oldest, beyond)), (tested, oldest, beyond)
        assert core == "ansible-core>=2.%d,<2.%d" % (oldest, min(beyond, 20)), core
