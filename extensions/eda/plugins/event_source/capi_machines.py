# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""converged.hpc.capi_machines - Cluster API Machines as events for ansible-rulebook.

Lists, then watches, Machines through the inventory plugin's client code (same
options: kubeconfig, context, host, api_key, validate_certs, ca_cert, or the
K8S_AUTH_* variables; namespaces, clusters, label_selector, node_type_label) and
emits one event per burst of transitions that matter to Slurm:

- ``up``: a Machine with a node-type label reaches Provisioned or Running;
- ``deleting``: a deletionTimestamp appears on a Machine holding our hook;
- ``relabelled``: its node-type label or a feature label changes.

At start it emits the current state (``initial``), so whatever happened while it
was down is caught up; and again (``resync``) after ``resync`` seconds (default 600) with no
event, so that a reconcile run that failed (the API or Slurm away) is run again though no
Machine changed since. A dropped watch resumes from its last resourceVersion; a
410 Gone lists again, and the difference to what it knew becomes transitions.
Transitions within ``window`` seconds (default 3) become one event:

    {"capi_machines": {"reasons": ["up"], "machines": [{"namespace": ..., "name": ...,
      "resourceVersion": ..., "reason": "up", "phase": ..., "node_type": ...}], "resourceVersion": ...}}

No credential is ever part of an event or a message.
"""

from __future__ import absolute_import, division, print_function

import asyncio
import os
import sys
import threading
import time

DOCUMENTATION = r"""
---
short_description: Cluster API Machines (list, then watch) as coalesced events for reconcile.yml
description:
  - Emits an event when Machines of a node type come up, start being deleted while holding the
    converged.hpc hook, or change their node-type or feature labels; bursts are coalesced.
options:
  kubeconfig:
    description: Path of a kubeconfig (else K8S_AUTH_KUBECONFIG, $KUBECONFIG, ~/.kube/config, in-cluster).
  context:
    description: kubeconfig context.
  host:
    description: API server URL (with api_key), else K8S_AUTH_HOST.
  api_key:
    description: Bearer token, else K8S_AUTH_API_KEY.
  validate_certs:
    description: Verify the API server's certificate.
  ca_cert:
    description: CA bundle path, else K8S_AUTH_SSL_CA_CERT.
  namespaces:
    description: Namespaces to watch; empty (default) watches all.
  clusters:
    description: Only Machines of these Cluster API clusters.
  label_selector:
    description: Extra label selector for Machines.
  node_type_label:
    description: The node-type label (default node-type). Machines without it are ignored.
  feature_label_prefix:
    description: Labels under this prefix are Slurm features (default feature.slurm.converged.hpc/).
  hook:
    description: Our deletion hook annotation (default the pre-terminate hook named converged-hpc).
  window:
    description: Seconds to coalesce transitions into one event (default 3).
  timeout:
    description: Seconds each watch request lasts before it is renewed (default 300).
  resync:
    description: Seconds without an event after which the current state is emitted again (reason
      resync), as at start, so that a reconcile that failed runs again with no Machine changing; 0 never
      (default 600).
"""

EXAMPLES = r"""
- name: Slurm follows Cluster API
  hosts: all
  sources:
    - converged.hpc.capi_machines:
        namespaces: [metal3]
        window: 3
  rules:
    - name: Reconcile
      condition: event.capi_machines is defined
      action:
        run_playbook:
          name: converged.hpc.reconcile
"""


def _collection_root():
    """Make ``ansible_collections.converged.hpc`` importable when ansible-rulebook loads this file by path."""
    parts = os.path.abspath(__file__).split(os.sep)
    # .../<root>/ansible_collections/converged/hpc/extensions/eda/plugins/event_source/capi_machines.py
    if len(parts) > 8 and parts[-8] == "ansible_collections":
        root = os.sep.join(parts[:-8])
        if root not in sys.path:
            sys.path.insert(0, root)


_collection_root()

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (  # noqa: E402
    CAPI_GROUP,
    AUTH_OPTIONS,
    CapiApiError,
    CapiReader,
    build_configuration,
)

UP = ("Provisioned", "Running")
HOOK = "pre-terminate.delete.hook.machine.cluster.x-k8s.io/converged-hpc"
FEATURES = "feature.slurm.converged.hpc/"


def summary(obj, args):
    """What matters of a Machine to Slurm, or None when it has no node type."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    node_type = labels.get(args.get("node_type_label") or "node-type")
    if not node_type:
        return None
    prefix = args.get("feature_label_prefix") or FEATURES
    return {"namespace": meta.get("namespace"), "name": meta.get("name"),
            "resourceVersion": meta.get("resourceVersion"), "phase": (obj.get("status") or {}).get("phase"),
            "node_type": node_type, "deleting": bool(meta.get("deletionTimestamp")),
            "hooked": (args.get("hook") or HOOK) in (meta.get("annotations") or {}),
            "features": sorted("%s=%s" % (k, v) for k, v in labels.items() if k.startswith(prefix))}


def transition(old, new):
    """The reason a change matters, or None."""
    if new is None:
        return None
    if new["deleting"]:
        return "deleting" if new["hooked"] and not (old and old["deleting"]) else None
    if new["phase"] in UP and (old is None or old["phase"] not in UP):
        return "up"
    if old is not None and (old["node_type"] != new["node_type"] or old["features"] != new["features"]):
        return "relabelled"
    return None


def current(known, reason="initial"):
    """The state as at start (initial, or resync): Machines up, and Machines being deleted that hold our hook."""
    return [dict(s, reason=reason) for s in known.values()
            if (s["deleting"] and s["hooked"]) or (not s["deleting"] and s["phase"] in UP)]


class Watcher:
    """Lists, then watches, the Machines of one namespace (or all) in a thread; calls emit(list of
    transitions). Resumes a dropped watch from its last resourceVersion; lists again on 410."""

    def __init__(self, reader, version, namespace, selector, args, emit, stop, initial=True):
        self.reader, self.namespace, self.selector, self.args = reader, namespace, selector, args
        self.emit, self.stop, self.initial = emit, stop, initial
        base = "/apis/%s/%s" % (CAPI_GROUP, version)
        self.path = "%s/namespaces/%s/machines" % (base, namespace) if namespace else "%s/machines" % base
        self.version = version
        self.known = {}
        self.rv = None
        self.lists = 0
        self.errors = []

    def relist(self):
        query = {"limit": 500}
        if self.selector:
            query["labelSelector"] = self.selector
        items, token = [], None
        while True:
            if token:
                query["continue"] = token
            status, body = self.reader.request(self.path, dict(query))
            if status == 410 and token:  # the snapshot behind the token expired: start again
                items, token = [], None
                query.pop("continue", None)
                continue
            if status != 200:
                self.reader._fail(status, body, "machines.%s" % CAPI_GROUP)
            import json  # pylint: disable=import-outside-toplevel
            data = json.loads(body)
            items.extend(data.get("items") or [])
            token = (data.get("metadata") or {}).get("continue")
            if not token:
                self.rv = data["metadata"]["resourceVersion"]
                break
        self.lists += 1
        fresh = {}
        for obj in items:
            s = summary(obj, self.args)
            if s:
                fresh[(s["namespace"], s["name"])] = s
        if self.initial:
            self.initial = False
            self.known = fresh
            self.emit(current(fresh), initial=True)
            return
        changes = []
        for key, s in fresh.items():
            reason = transition(self.known.get(key), s)
            if reason:
                changes.append(dict(s, reason=reason))
        self.known = fresh
        if changes:
            self.emit(changes)

    def handle(self, event):
        etype, obj = event.get("type"), event.get("object") or {}
        if etype == "ERROR":
            if obj.get("code") == 410:
                return "relist"
            raise CapiApiError("the watch of Machines at %s failed: %s" % (self.reader.host, obj.get("message")))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.rv = rv
        if etype == "BOOKMARK":
            return None
        key = ((obj.get("metadata") or {}).get("namespace"), (obj.get("metadata") or {}).get("name"))
        if etype == "DELETED":
            self.known.pop(key, None)
            return None
        s = summary(obj, self.args)
        old = self.known.get(key)
        if s is None:
            self.known.pop(key, None)
            return None
        self.known[key] = s
        reason = transition(old, s)
        if reason:
            self.emit([dict(s, reason=reason)])
        return None

    def run(self):
        backoff = 1.0
        need_list = True
        while not self.stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                query = {"watch": "true", "resourceVersion": self.rv, "allowWatchBookmarks": "true",
                         "timeoutSeconds": int(self.args.get("timeout") or 300)}
                if self.selector:
                    query["labelSelector"] = self.selector
                for event in self.reader.watch(self.path, query, read_timeout=query["timeoutSeconds"] + 30):
                    if self.stop.is_set():
                        return
                    if self.handle(event) == "relist":
                        need_list = True
                        break
                backoff = 1.0
            except CapiApiError as exc:  # dropped or refused: resume from the last resourceVersion
                self.errors.append(str(exc))
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)


def selector_of(args):
    parts = [args["label_selector"]] if args.get("label_selector") else []
    clusters = args.get("clusters") or []
    if clusters:
        parts.append("cluster.x-k8s.io/cluster-name in (%s)" % ",".join(clusters))
    return ",".join(parts)


def connect(args):
    """The reader and the Machine version, or CapiApiError with one clear line."""
    configuration, headers = build_configuration(**{k: args.get(k) for k in AUTH_OPTIONS})
    reader = CapiReader(configuration, headers=headers)
    version = reader.preferred_version(CAPI_GROUP)
    if version is None:
        raise CapiApiError("the Kubernetes API at %s does not serve %s: is Cluster API installed?"
                           % (reader.host, CAPI_GROUP))
    return reader, version


def make_event(batch):
    machines = {}
    for change in batch:
        machines[(change["namespace"], change["name"])] = change  # the latest of each Machine
    listed = [{k: m[k] for k in ("namespace", "name", "resourceVersion", "reason", "phase", "node_type")}
              for m in sorted(machines.values(), key=lambda m: (m["namespace"] or "", m["name"]))]
    rvs = [int(m["resourceVersion"]) for m in listed if str(m.get("resourceVersion") or "").isdigit()]
    return {"capi_machines": {"reasons": sorted({m["reason"] for m in listed}) or ["initial"], "machines": listed,
                              "resourceVersion": str(max(rvs)) if rvs else "", "at": time.time()}}


async def main(queue, args):
    """ansible-rulebook's entry point."""
    args = dict(args or {})
    window = float(args.get("window", 3))
    try:
        resync = float(args.get("resync", 600) or 0)
    except (TypeError, ValueError):
        resync = -1
    if resync < 0:
        raise ValueError("converged.hpc.capi_machines: resync=%r is not 0 (never) or a number of seconds"
                         % (args.get("resync"),))
    loop = asyncio.get_running_loop()
    try:
        reader, version = await loop.run_in_executor(None, connect, args)
    except CapiApiError as exc:
        raise CapiApiError("converged.hpc.capi_machines cannot start: %s" % exc) from None
    changes = asyncio.Queue()
    stop = threading.Event()
    pending_initial = {"left": len(args.get("namespaces") or [None])}

    def emit(batch, initial=False):
        loop.call_soon_threadsafe(changes.put_nowait, (batch, initial))

    watchers = [Watcher(reader, version, ns, selector_of(args), args, emit, stop)
                for ns in (args.get("namespaces") or [None])]
    threads = [threading.Thread(target=w.run, daemon=True, name="capi-watch-%s" % (w.namespace or "all"))
               for w in watchers]
    for thread in threads:
        thread.start()
    last = loop.time()
    try:
        while True:
            try:
                batch, initial = await asyncio.wait_for(
                    changes.get(), max(last + resync - loop.time(), 0.05) if resync > 0 else None)
            except asyncio.TimeoutError:
                last = loop.time()
                if pending_initial["left"] <= 0:  # the state as at start, from what the watches know
                    known = {k: v for w in watchers for k, v in dict(w.known).items()}
                    event = make_event(current(known, "resync"))
                    event["capi_machines"]["reasons"] = ["resync"]  # with no Machine up too
                    await queue.put(event)
                continue
            is_initial = initial
            if initial:
                pending_initial["left"] -= 1
            deadline = loop.time() + window
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0 and pending_initial["left"] <= 0:
                    break
                try:
                    more, more_initial = await asyncio.wait_for(changes.get(), max(remaining, 0.05))
                except asyncio.TimeoutError:
                    if pending_initial["left"] <= 0:
                        break
                    continue
                batch = batch + more
                if more_initial:
                    pending_initial["left"] -= 1
                    is_initial = True
            event = make_event(batch)
            if is_initial and "initial" not in event["capi_machines"]["reasons"]:
                event["capi_machines"]["reasons"] = sorted(event["capi_machines"]["reasons"] + ["initial"])
            await queue.put(event)
            last = loop.time()
    finally:
        stop.set()
        reader.close()


if __name__ == "__main__":
    # Without ansible-rulebook: print the events (K8S_AUTH_* or a kubeconfig say where).
    class _Printer:
        async def put(self, event):
            import json  # pylint: disable=import-outside-toplevel
            print(json.dumps(event), flush=True)

    try:
        asyncio.run(main(_Printer(), {"namespaces": list(sys.argv[1:])}))
    except CapiApiError as error:
        sys.exit(str(error))
    except KeyboardInterrupt:
        pass
