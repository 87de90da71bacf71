"""Metal3 as it behaves with a pool of hosts: the part of CAPM3 that associates a Metal3Machine with a
BareMetalHost, and the part of the Bare Metal Operator that moves a host through its states.

A BareMetalHost is registered once and outlives every Machine it serves:

    available --(claimed by a Metal3Machine)--> provisioning --> provisioned
    provisioned --(its Machine deleted, hooks released)--> deprovisioning --(N s)--> available

A MachineDeployment (or MachinePool) whose template's infrastructureRef names a Metal3MachineTemplate
that exists in the store gets its hosts from the pool: each new Machine's Metal3Machine is a copy of the
template's spec (hostSelector, image...), and claims one available host that its hostSelector matches
(matchLabels, and matchExpressions whose operator CAPM3 lower-cases: In, NotIn, Exists, "!", Gt, Lt), as
CAPM3's chooseHost: no consumerRef, not being deleted, no error, not paused or marked unhealthy, state
available (or ready). The claim writes the host's consumerRef, image, userData, online and the cluster's
label, and the Metal3Machine's metal3.io/BareMetalHost annotation. With no host to claim the Machine waits
in Provisioning, its Metal3Machine saying why (condition AssociateBareMetalHost, reason
AssociateBareMetalHostFailed, "no available host found. Requeuing"), and claims one as soon as one is
available. On deletion the host is deprovisioned (image and userData removed, powered off), stays
deprovisioning for the time set (deprovision_seconds: Ironic's cleaning and power cycle, 145 s on the
reference hardware), and only then loses its consumerRef and becomes available; the Machine is gone
after that, as CAPM3 keeps the Metal3Machine until the host is deprovisioned.

Templates without such an object keep the simulator's older behaviour (a host made for each Machine).
"""

import copy
import threading
import time

from .store import ApiError, now

INFRA = "infrastructure.cluster.x-k8s.io"
METAL3 = "metal3.io"
BMH_ANNOTATION = "metal3.io/BareMetalHost"
CLONED_FROM_NAME = "cluster.x-k8s.io/cloned-from-name"
CLONED_FROM_KIND = "cluster.x-k8s.io/cloned-from-groupkind"
TEMPLATE_KIND = "Metal3MachineTemplate." + INFRA
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
PAUSED = "baremetalhost.metal3.io/paused"
UNHEALTHY = ("capm3.metal3.io/unhealthy", "capi.metal3.io/unhealthy")
NO_HOST = "no available host found. Requeuing"
OPERATORS = ("in", "notin", "exists", "!", "=", "==", "!=", "gt", "lt")


class SelectorError(ValueError):
    pass


def selector_matches(selector, labels):
    """A hostSelector (matchLabels, matchExpressions) against a host's labels, as CAPM3 builds it: each
    expression's operator lower-cased into a label requirement; an operator it cannot build raises."""
    labels = labels or {}
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), str(expr.get("operator", "")).lower(), expr.get("values") or []
        if op not in OPERATORS:
            raise SelectorError("hostSelector: %r is not a supported operator for key %r (In, NotIn, Exists, "
                                "!, Gt, Lt)" % (expr.get("operator"), key))
        present = key in labels
        if op in ("in", "=", "==") and (not present or labels[key] not in values):
            return False
        if op in ("notin", "!=") and present and labels[key] in values:
            return False
        if op == "exists" and not present:
            return False
        if op == "!" and present:
            return False
        if op in ("gt", "lt"):
            try:
                have, want = int(labels[key]), int(values[0])
            except (KeyError, ValueError, IndexError):
                return False
            if (op == "gt" and have <= want) or (op == "lt" and have >= want):
                return False
    return True


def host_image(image):
    """A Metal3Machine's image as CAPM3 writes it on the host: v1beta2's diskFormat is the host's format."""
    out = {k: v for k, v in image.items() if k in ("url", "checksum", "checksumType", "format")}
    if image.get("diskFormat"):
        out["format"] = image["diskFormat"]
    return out


def host_state(bmh):
    return ((bmh.get("status") or {}).get("provisioning") or {}).get("state", "")


class Metal3Pool:
    """Driven by CapiController's loop (reconcile) and its deletion (release)."""

    def __init__(self, ctl, deprovision_seconds=0.0):
        self.ctl = ctl
        self.store = ctl.store
        self.deprovision_seconds = float(deprovision_seconds)

    # ------------------------------------------------------------------ helpers
    def _res(self, group, plural):
        return self.store.resource(group, plural)

    def template_of(self, owner):
        """The Metal3MachineTemplate an owner's template names, when the store has it, else None."""
        ref = (((owner.get("spec") or {}).get("template") or {}).get("spec") or {}).get("infrastructureRef") or {}
        if ref.get("kind") != "Metal3MachineTemplate" or not ref.get("name"):
            return None
        try:
            with self.store.lock:
                return self.store.get(self._res(INFRA, "metal3machinetemplates"),
                                      owner["metadata"].get("namespace"), ref["name"])
        except ApiError:
            return None

    @staticmethod
    def is_pool_machine(m3m):
        return (m3m["metadata"].get("annotations") or {}).get(CLONED_FROM_KIND) == TEMPLATE_KIND

    def metal3machine_for(self, template, machine):
        """The Metal3Machine CAPI clones from the template for a new Machine."""
        meta = machine["metadata"]
        spec = copy.deepcopy(((template.get("spec") or {}).get("template") or {}).get("spec") or {})
        return {"apiVersion": INFRA + "/v1beta2", "kind": "Metal3Machine",
                "metadata": {"name": meta["name"], "namespace": meta.get("namespace"),
                             "labels": {CLUSTER_LABEL: machine["spec"].get("clusterName", "")},
                             "annotations": {CLONED_FROM_NAME: template["metadata"]["name"],
                                             CLONED_FROM_KIND: TEMPLATE_KIND},
                             "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                                                  "name": meta["name"], "uid": meta.get("uid", ""),
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": spec}

    def _set_condition(self, m3m, ok, reason, message=""):
        """AssociateBareMetalHost (v1beta2) and AssociateBMH (v1beta1), written only when they change."""
        status = m3m.get("status") or {}
        current = next((c for c in status.get("conditions") or [] if c.get("type") == "AssociateBareMetalHost"),
                       None)
        want = "True" if ok else "False"
        if current and (current.get("status"), current.get("reason"), current.get("message")) == \
                (want, reason, message):
            return
        stamp = now()
        v1beta1 = {"type": "AssociateBMH", "status": want, "lastTransitionTime": stamp}
        if not ok:
            v1beta1.update(severity="Error", reason="AssociateBMHFailed", message=message)
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "AssociateBareMetalHost"]
        conditions.append({"type": "AssociateBareMetalHost", "status": want, "reason": reason, "message": message,
                           "lastTransitionTime": stamp})
        self.ctl._status(self._res(INFRA, "metal3machines"), m3m,
                         {"conditions": conditions, "deprecated": {"v1beta1": {"conditions": [v1beta1]}}})

    # ------------------------------------------------------------------ association
    def reconcile(self):
        for m3m in self.ctl._items(INFRA, "metal3machines"):
            meta = m3m["metadata"]
            if not self.is_pool_machine(m3m) or meta.get("deletionTimestamp") \
                    or BMH_ANNOTATION in (meta.get("annotations") or {}) or meta["name"] in self.ctl.busy:
                continue
            try:
                machine = self.store.get(self._res("cluster.x-k8s.io", "machines"), meta.get("namespace"),
                                         meta["name"])
            except ApiError:
                continue
            if machine["metadata"].get("deletionTimestamp"):
                continue
            self._associate(m3m, machine)

    def candidates(self, m3m):
        """The hosts this Metal3Machine may claim now, by name (CAPM3's chooseHost, before its pick)."""
        out = []
        ns = m3m["metadata"].get("namespace")
        for bmh in self.ctl._items(METAL3, "baremetalhosts"):
            meta = bmh["metadata"]
            if meta.get("namespace") != ns or meta.get("deletionTimestamp"):
                continue
            if (bmh.get("spec") or {}).get("consumerRef") or (bmh.get("status") or {}).get("errorMessage"):
                continue
            annotations = meta.get("annotations") or {}
            if PAUSED in annotations or any(a in annotations for a in UNHEALTHY):
                continue
            if host_state(bmh) not in ("available", "ready"):
                continue
            if selector_matches((m3m.get("spec") or {}).get("hostSelector"), meta.get("labels")):
                out.append(meta["name"])
        return sorted(out)

    def _associate(self, m3m, machine):
        ns, name = m3m["metadata"].get("namespace"), m3m["metadata"]["name"]
        try:
            with self.store.lock:
                hosts = self.candidates(m3m)
                if not hosts:
                    self._set_condition(m3m, False, "AssociateBareMetalHostFailed", NO_HOST)
                    return
                host = self.ctl.random.choice(hosts)
                bmh_res = self._res(METAL3, "baremetalhosts")
                bmh = copy.deepcopy(self.store.get(bmh_res, ns, host))
                spec = bmh.setdefault("spec", {})
                spec["consumerRef"] = {"apiVersion": INFRA + "/v1beta2", "kind": "Metal3Machine", "name": name,
                                       "namespace": ns}
                image = (m3m.get("spec") or {}).get("image")
                if image:
                    spec["image"] = host_image(image)
                secret = ((machine.get("spec") or {}).get("bootstrap") or {}).get("dataSecretName")
                if secret:
                    spec["userData"] = {"name": secret, "namespace": ns}
                spec["online"] = True
                bmh["metadata"].setdefault("labels", {})[CLUSTER_LABEL] = machine["spec"].get("clusterName", "")
                bmh = self.store.update(bmh_res, ns, host, bmh)
                self.ctl._status(bmh_res, bmh, {"provisioning": dict((bmh.get("status") or {}).get("provisioning")
                                                                     or {}, state="provisioning")})
                m3m_res = self._res(INFRA, "metal3machines")
                body = copy.deepcopy(self.store.get(m3m_res, ns, name))
                body["metadata"].setdefault("annotations", {})[BMH_ANNOTATION] = "%s/%s" % (ns, host)
                body = self.store.update(m3m_res, ns, name, body)
                self._set_condition(body, True, "AssociateBareMetalHostSuccess")
        except SelectorError as err:
            self._set_condition(m3m, False, "AssociateBareMetalHostFailed", str(err))
            return
        self.ctl.note(name, "claimed host " + host)
        self.ctl.busy.add(name)
        node_type = (machine["metadata"].get("labels") or {}).get("node-type", "")
        threading.Thread(target=self._provision, args=(ns, name, host, node_type), daemon=True).start()

    def _provision(self, ns, name, host, node_type):
        bmh_res = self._res(METAL3, "baremetalhosts")
        try:
            bmh = self.store.get(bmh_res, ns, host)
            nics = ((bmh.get("status") or {}).get("hardware") or {}).get("nics") or []
            address = next((n.get("ip") for n in nics if n.get("ip")), "")
            hostname, address, cpus, ram = self.ctl.provisioner.provision_host(
                host, address, name, node_type, self.ctl._bootstrap_data(ns, name))
        except Exception as exc:
            self.ctl.errors.append("provisioning %s on host %s failed: %s" % (name, host, exc))
            with self.store.lock:
                try:
                    self.ctl._status(bmh_res, self.store.get(bmh_res, ns, host),
                                     {"errorMessage": "provisioning failed: %s" % exc, "errorType":
                                      "provisioning error"})
                except ApiError:
                    pass
            self.ctl._set_machine_phase(ns, name, "Failed")
            self.ctl.busy.discard(name)
            return
        self.ctl.finish_provisioned(ns, name, host, hostname, address, cpus, ram, pool=True)
        self.ctl.busy.discard(name)

    # ------------------------------------------------------------------ deprovisioning
    def release(self, ns, name, m3m):
        """A deleted pool Machine's host: deprovisioned, then available again; returns when it is."""
        ref = (m3m["metadata"].get("annotations") or {}).get(BMH_ANNOTATION)
        if not ref:
            return
        host = ref.split("/", 1)[-1]
        bmh_res = self._res(METAL3, "baremetalhosts")
        with self.store.lock:
            try:
                bmh = copy.deepcopy(self.store.get(bmh_res, ns, host))
            except ApiError:
                return
            if ((bmh.get("spec") or {}).get("consumerRef") or {}).get("name") != name:
                return  # another Metal3Machine's now: never touch it
            spec = bmh["spec"]
            spec.pop("image", None)
            spec.pop("userData", None)
            spec["online"] = False
            bmh = self.store.update(bmh_res, ns, host, bmh)
            self.ctl._status(bmh_res, bmh, {"provisioning": dict((bmh.get("status") or {}).get("provisioning") or {},
                                                                 state="deprovisioning"), "poweredOn": False})
        self.ctl.note(name, "deprovisioning host " + host)
        self.ctl.provisioner.release(host)
        deadline = time.time() + self.deprovision_seconds
        while time.time() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.time())))
        with self.store.lock:
            bmh = copy.deepcopy(self.store.get(bmh_res, ns, host))
            bmh["spec"].pop("consumerRef", None)
            bmh = self.store.update(bmh_res, ns, host, bmh)
            provisioning = dict((bmh.get("status") or {}).get("provisioning") or {}, state="available")
            provisioning.pop("image", None)
            self.ctl._status(bmh_res, bmh, {"provisioning": provisioning})
        self.ctl.note(name, "host %s available" % host)
