"""The collection's rulebook run by the real ansible-rulebook (Java 17 + drools) on a real kube-apiserver:
the initial state starts one run, a burst of Machines one more, and a source stopped and started
again misses nothing. The playbook it runs here records the event it was given
(converged_reconcile_playbook); the lab's e2e runs the real reconcile.yml."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import yaml

from awx_receiver import Receiver
from conftest import ADMIN_TOKEN, CAPI_G, CAPI_V, REPO, a_machine, ansible_env

pytestmark = pytest.mark.skipif(not shutil.which("ansible-rulebook") or not shutil.which("java"),
                                reason="needs ansible-rulebook and a Java 17 runtime")

# the limit ansible-rulebook gives (the ruleset's hosts) passes the lifecycle playbooks' check
RECORD = """
- hosts: localhost
  gather_facts: false
  vars:
    converged_limit_needs_localhost: true
  tasks:
    - name: Check the limit as the lifecycle playbooks do
      ansible.builtin.import_tasks: {limit_check}
    - name: Record the event
      ansible.builtin.lineinfile:
        path: "{path}"
        line: "{{{{ ansible_eda.event | to_json }}}}"
        create: true
        mode: "0600"
"""


def start(tmp_path, env_extra, rulebook="reconcile", namespace="metal3", **rulebook_vars):
    record = tmp_path / "events.jsonl"
    limit_check = os.path.join(REPO, "playbooks", "tasks", "limit_check.yml")
    (tmp_path / "record.yml").write_text(RECORD.format(path=record, limit_check=limit_check))
    (tmp_path / "vars.yml").write_text(yaml.safe_dump(dict({
        # the source's default window (3 s): a burst of ten Machines' twenty writes fits in it on a loaded
        # machine too (1 s did not)
        "converged_capi_namespaces": [namespace], "converged_capi_window": 3,
        "converged_reconcile_playbook": str(tmp_path / "record.yml")}, **rulebook_vars)))
    (tmp_path / "vars.yml").chmod(0o600)
    (tmp_path / "hosts").write_text("localhost ansible_connection=local ansible_python_interpreter=%s\n"
                                    % sys.executable)
    env = ansible_env(**env_extra)
    proc = subprocess.Popen(["ansible-rulebook", "-r", "converged.hpc." + rulebook, "-i", str(tmp_path / "hosts"),
                             "--vars", str(tmp_path / "vars.yml")],
                            cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    return proc, record


def events(record):
    if not record.exists():
        return []
    return [json.loads(line)["capi_machines"] for line in record.read_text().splitlines() if line.strip()]


def wait_events(record, count, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(events(record)) >= count:
            return events(record)
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.3)
    seen = len(events(record))
    raise AssertionError("%d event run(s) of %d after %d s: %s" % (seen, count, timeout, stop(proc)[-3000:]))


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        out = proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out = proc.communicate()[0]
    assert ADMIN_TOKEN not in out
    return out


def test_events_run_the_playbook_once_per_burst_and_a_restart_misses_nothing(world, tmp_path):
    a_machine(world, "cn-1")
    env = world.auth_env()
    proc, record = start(tmp_path, env, namespace=world.ns)
    try:
        first = wait_events(record, 1, proc)[0]
        assert first["reasons"] == ["initial"] and [m["name"] for m in first["machines"]] == ["cn-1"]
        for i in range(2, 12):  # ten Machines come up at once: one run
            a_machine(world, "cn-%d" % i)
        second = wait_events(record, 2, proc)[1]
        assert second["reasons"] == ["up"] and len(second["machines"]) == 10
        time.sleep(4)  # past the window: nothing more came
        assert len(events(record)) == 2
    finally:
        stop(proc)
    a_machine(world, "cn-12")  # while nothing watches
    world.api().delete(CAPI_G + "/" + CAPI_V, "machines", world.ns, "cn-1")  # its finalizer keeps it: deleting
    proc, record = start(tmp_path, env, namespace=world.ns)
    try:
        third = wait_events(record, 3, proc)[2]
        names = [m["name"] for m in third["machines"]]
        assert third["reasons"] == ["initial"] and "cn-12" in names and "cn-1" in names  # caught up
        assert {m["reason"] for m in third["machines"]} == {"initial"}
    finally:
        stop(proc)


def test_a_bad_start_is_one_clear_line(world, tmp_path):
    proc, _record = start(tmp_path, dict(world.auth_env(), K8S_AUTH_API_KEY="not-the-token"), namespace=world.ns)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0
    assert "converged.hpc.capi_machines cannot start" in out and "401 Unauthorized" in out, out
    assert "not-the-token" not in out


@pytest.mark.parametrize("service", ["github", "gitlab"])
def test_events_reach_awx_as_signed_webhooks_one_job_per_burst(world, tmp_path, service):
    key = "webhook-key-%s-Xw3" % service
    awx = Receiver({7: {"service": service, "key": key}})
    a_machine(world, "cn-1")
    env = world.auth_env()
    proc, _record = start(tmp_path, env, "reconcile_webhook", world.ns, converged_awx_webhook_url=awx.webhook_url(7),
                          converged_awx_webhook_service=service, converged_awx_webhook_key=key)
    try:
        deadline = time.monotonic() + 90
        while not awx.jobs and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        assert len(awx.jobs) == 1, stop(proc)[-3000:]
        for i in range(2, 7):  # five Machines at once: one more delivery, one more job
            a_machine(world, "cn-%d" % i)
        while len(awx.jobs) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        time.sleep(3)
        assert len(awx.jobs) == 2, stop(proc)[-3000:]
        assert all(status == 202 for status, _message in awx.answers)  # signed / keyed as AWX checks it
        initial, burst = (extra["awx_webhook_payload"] for _template, extra in awx.jobs)
        assert initial["reasons"] == ["initial"] and [m["name"] for m in initial["machines"]] == ["cn-1"]
        assert burst["reasons"] == ["up"] and sorted(m["name"] for m in burst["machines"]) == \
            ["cn-%d" % i for i in range(2, 7)]
        assert all(m["resourceVersion"] for m in burst["machines"])  # what makes each delivery unique
    finally:
        out = stop(proc)
        awx.stop()
    assert key not in out


def ticks_and_events(world, tmp_path, tmp_path_factory, rulebook, ticks_wanted):
    """Run a ticking rulebook (autoscale, rebalance) until it has run its playbook on ticks_wanted ticks and on
    a Machine event; every event it ran the playbook with."""
    # TMPDIR: the tick source's stamp is per user and source name; this test's stays apart from a lab's
    # (not under tmp_path: ansible-rulebook copies its working directory into TMPDIR)
    tmpdir = tmp_path_factory.mktemp("tmpdir")
    env = dict(world.auth_env(), TMPDIR=str(tmpdir))
    proc, record = start(tmp_path, env, rulebook, world.ns,
                         **{"converged_%s_playbook" % rulebook: str(tmp_path / "record.yml"),
                            "converged_%s_interval" % rulebook: 2})
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            lines = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
            if sum("tick" in e for e in lines) >= ticks_wanted and any("capi_machines" in e for e in lines):
                return lines, tmpdir
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.3)
        raise AssertionError("no ticks and Machine events after 90 s: %s" % stop(proc)[-3000:])
    finally:
        stop(proc)


def test_the_autoscale_rulebook_ticks_the_autoscaler_and_still_reconciles(world, tmp_path, tmp_path_factory):
    a_machine(world, "cn-1")
    lines, tmpdir = ticks_and_events(world, tmp_path, tmp_path_factory, "autoscale", 3)
    ticks = [e["tick"] for e in lines if "tick" in e]
    assert [t["index"] for t in ticks[:3]] == [0, 1, 2] and {t["name"] for t in ticks} == {"autoscale"}
    # one stamp for the source (autoscale.yml records its full runs in it), emptied at its start
    assert {t["stamp"] for t in ticks} == {str(tmpdir / ("converged-hpc-tick-%d" % os.getuid()) / "autoscale")}
    machine_events = [e["capi_machines"] for e in lines if "capi_machines" in e]
    assert [m["name"] for m in machine_events[0]["machines"]] == ["cn-1"]


def test_the_rebalance_rulebook_ticks_the_policy_and_still_reconciles(world, tmp_path, tmp_path_factory):
    a_machine(world, "cn-2")
    lines, dummy = ticks_and_events(world, tmp_path, tmp_path_factory, "rebalance", 2)
    ticks = [e["tick"] for e in lines if "tick" in e]
    assert [t["index"] for t in ticks[:2]] == [0, 1] and {t["name"] for t in ticks} == {"rebalance"}
    assert "cn-2" in [m["name"] for e in lines if "capi_machines" in e for m in e["capi_machines"]["machines"]]
