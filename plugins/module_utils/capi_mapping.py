# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Pure mapping from Cluster API / Metal3 objects to inventory hosts and groups.

No API access here: the input is plain dicts as the API returns them (or as
the inventory cache holds them), so the mapping is unit-tested with recorded
objects. The groups produced are the contract with the roles:

  <prefix><node-type>       every Machine by its node-type label value
                            (controller, compute, login, ...), not being deleted
  capi_cluster_<name>       by cluster (cluster.x-k8s.io/cluster-name)
  capi_md_<name>            by owning MachineDeployment (capi_md_<namespace>_<name> when
                            several namespaces have one of that name)
  capi_mp_<name>            by owning MachinePool (the same)
  capi_deleting             Machines with metadata.deletionTimestamp set (only here)
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
from dataclasses import dataclass, field

DEPLOYMENT_LABEL = "cluster.x-k8s.io/deployment-name"
SET_LABEL = "cluster.x-k8s.io/set-name"
POOL_LABEL = "cluster.x-k8s.io/pool-name"
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"
BMH_ANNOTATION = "metal3.io/BareMetalHost"
INFRA_GROUP = "infrastructure.cluster.x-k8s.io"
_GROUP_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# a host name (RFC 1123): what a Machine's Hostname address (copied by CAPM3 from the host's hardware
# details, which whoever may edit a BareMetalHost can write) must be to name a host; the others are
# Kubernetes object names, which the API server checked
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_OK = re.compile(r"^%s(?:\.%s)*$" % (_HOST_LABEL, _HOST_LABEL))
# hostvars "lean": what the roles, playbooks and filters of this collection read (docs/inventory.md)
LEAN_KEYS = ("name", "namespace", "api_version", "cluster", "phase", "node_type", "labels", "annotations",
             "deleting", "machine_deployment", "machine_pool", "hostname", "cpus", "ram_mib")
# labels and annotations Cluster API and kubectl keep for themselves; their values are in the other keys
_OWN_PREFIXES = ("cluster.x-k8s.io/",)
_OWN_KEYS = ("machine-template-hash", "kubectl.kubernetes.io/last-applied-configuration")


def _user_keys(mapping):
    """A label or annotation dict without Cluster API's and kubectl's own entries."""
    return {k: v for k, v in mapping.items() if not k.startswith(_OWN_PREFIXES) and k not in _OWN_KEYS}


@dataclass
class MappingOptions:
    node_type_label: str = "node-type"
    group_prefix: str = ""
    phases: tuple = ("Running", "Provisioned")
    include_deleting: bool = True
    deleting_group: str = "capi_deleting"
    address_types: tuple = ("InternalIP", "ExternalIP", "Hostname")
    nic_names: tuple = ()
    nic_cidrs: tuple = ()
    host_naming: str = "machine"
    clusters: tuple = ()
    hostvar_name: str = "capi"
    hostvars: str = "lean"


@dataclass
class MappedInventory:
    hosts: dict = field(default_factory=dict)  # host name -> hostvars
    groups: dict = field(default_factory=dict)  # group -> [host names]
    warnings: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)  # "ns/name" -> reason

    def add(self, group, host):
        self.groups.setdefault(group, []).append(host)


def sanitize_group(name):
    """An Ansible-safe group name: letters, digits, underscores; no leading digit."""
    clean = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not clean or clean[0].isdigit():
        clean = "_" + clean
    return clean


def _networks(cidrs):
    if not cidrs:
        return []
    try:
        import netaddr
    except ImportError:
        raise ValueError("nic_cidrs needs the Python 'netaddr' library on the control node")
    nets = []
    for cidr in cidrs:
        try:
            nets.append(netaddr.IPNetwork(cidr))
        except (netaddr.AddrFormatError, ValueError, TypeError):
            raise ValueError("nic_cidrs: %r is not a network in CIDR notation" % (cidr,))
    return nets


def _ip_in(ip, nets):
    import netaddr
    try:
        addr = netaddr.IPAddress(ip)
    except (netaddr.AddrFormatError, ValueError, TypeError):
        return False
    return any(addr in net for net in nets)


def _pick_address(addresses, nics, opts, nets):
    """NIC preference (name, then CIDR) for Metal3 hosts, then Machine address types in order."""
    for name in opts.nic_names:
        for nic in nics:
            if nic.get("name") == name and nic.get("ip"):
                return nic["ip"]
    for net in nets:
        for nic in nics:
            if nic.get("ip") and _ip_in(nic["ip"], [net]):
                return nic["ip"]
    by_type = {}
    for addr in addresses or []:
        if addr.get("address"):
            by_type.setdefault(addr.get("type"), addr["address"])
    for kind in opts.address_types:
        if kind in by_type:
            return by_type[kind]
    return None


def _owner(meta, kind):
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == kind:
            return ref.get("name")
    return None


def _hardware(machine, m3m_index, bmh_index):
    """The Metal3Machine and BareMetalHost behind a Machine, and the host's hardware."""
    meta = machine["metadata"]
    ref = (machine.get("spec") or {}).get("infrastructureRef") or {}
    group = ref.get("apiGroup") or (ref.get("apiVersion") or "").rpartition("/")[0] or INFRA_GROUP
    if ref.get("kind") != "Metal3Machine" or group != INFRA_GROUP:
        return None, None
    m3m = m3m_index.get((ref.get("namespace") or meta.get("namespace"), ref.get("name")))
    if m3m is None:
        return None, None
    bmh_ref = ((m3m.get("metadata") or {}).get("annotations") or {}).get(BMH_ANNOTATION, "")
    ns, dummy, name = bmh_ref.rpartition("/")
    bmh = bmh_index.get((ns or meta.get("namespace"), name)) if name else None
    return m3m, bmh


def _cluster(machine):
    meta = machine.get("metadata") or {}
    return (machine.get("spec") or {}).get("clusterName") or (meta.get("labels") or {}).get(CLUSTER_LABEL)


def _deployment_and_pool(meta):
    labels = meta.get("labels") or {}
    return labels.get(DEPLOYMENT_LABEL), labels.get(POOL_LABEL) or _owner(meta, "MachinePool")


def _in_clusters(machines, clusters):
    return [m for m in machines if not clusters or _cluster(m) in clusters]


def _base_name(machine, opts):
    """The host's name: the Machine's; its Node's (host_naming node, when it has one); or the name its host
    has (host_naming hostname: the Machine's Hostname address, which CAPM3 copies from the host's hardware
    details, when it has one). Cluster API names a MachineDeployment's Machines after their MachineSet."""
    meta, status = machine.get("metadata") or {}, machine.get("status") or {}
    if opts.host_naming == "node":
        return (status.get("nodeRef") or {}).get("name") or meta.get("name")
    if opts.host_naming == "hostname":
        return next((a["address"] for a in status.get("addresses") or []
                     if a.get("type") == "Hostname" and a.get("address")), None) or meta.get("name")
    return meta.get("name")


def _first_holders(machines, opts):
    """Host name -> the Machine (namespace/name) created first among those it would name. That
    one keeps the bare name and the others are qualified with their namespace, so a new Machine
    never renames an existing host, whatever its namespace sorts as."""
    firsts = {}
    for machine in machines:
        meta = machine.get("metadata") or {}
        key = (meta.get("creationTimestamp") or "", meta.get("namespace") or "", meta.get("name") or "")
        name = _base_name(machine, opts)
        if name not in firsts or key < firsts[name][0]:
            firsts[name] = (key, "%s/%s" % (meta.get("namespace"), meta.get("name")))
    return {name: ident for name, (dummy, ident) in firsts.items()}


def build(objects, opts):
    """Map {'machines': [...], 'metal3machines': [...], 'baremetalhosts': [...]} to a MappedInventory."""
    inv = MappedInventory()
    nets = _networks(opts.nic_cidrs)
    m3m_index = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                 for o in objects.get("metal3machines") or []}
    bmh_index = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
                 for o in objects.get("baremetalhosts") or []}
    machines = _in_clusters(objects.get("machines") or [], set(opts.clusters))
    firsts = _first_holders(machines, opts)
    owners = _owner_namespaces(machines)
    warned = set()
    for machine in machines:
        meta = machine.get("metadata") or {}
        spec = machine.get("spec") or {}
        status = machine.get("status") or {}
        ident = "%s/%s" % (meta.get("namespace"), meta.get("name"))
        labels = meta.get("labels") or {}
        cluster = _cluster(machine)
        deleting = bool(meta.get("deletionTimestamp"))
        phase = status.get("phase") or "Unknown"
        if deleting and not opts.include_deleting:
            inv.skipped[ident] = "being deleted"
            continue
        if not deleting and phase not in opts.phases:
            inv.skipped[ident] = "phase %s" % phase
            continue
        node_type = labels.get(opts.node_type_label)
        if not node_type:
            inv.skipped[ident] = "no %s label" % opts.node_type_label
            inv.warnings.append("Machine %s skipped: it has no '%s' label" % (ident, opts.node_type_label))
            continue
        group = opts.group_prefix + node_type
        if not _GROUP_OK.match(group):
            clean = sanitize_group(group)
            inv.warnings.append("Machine %s: %s=%s is not a valid group name, using group '%s'"
                                % (ident, opts.node_type_label, node_type, clean))
            group = clean
        m3m, bmh = _hardware(machine, m3m_index, bmh_index)
        hardware = ((bmh or {}).get("status") or {}).get("hardware") or {}
        nics = [{k: nic.get(k) for k in ("name", "ip", "mac", "speedGbps") if k in nic}
                for nic in hardware.get("nics") or []]
        addresses = status.get("addresses") or ((m3m or {}).get("status") or {}).get("addresses") or []
        address = _pick_address(addresses, nics, opts, nets)
        if address is None and not deleting:
            inv.skipped[ident] = "no usable address"
            inv.warnings.append("Machine %s skipped: no address of type %s%s" % (
                ident, "/".join(opts.address_types), " or on NICs %s" % "/".join(opts.nic_names)
                if opts.nic_names else ""))
            continue
        node_ref = (status.get("nodeRef") or {}).get("name")
        name = _base_name(machine, opts)
        if not isinstance(name, str) or len(name) > 253 or not _HOST_OK.fullmatch(name):
            shown = repr(name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "...")
            inv.skipped[ident] = "no valid host name"
            inv.warnings.append("Machine %s skipped: its host name %s (host_naming: %s) is not a valid host name"
                                % (ident, shown, opts.host_naming))
            continue
        if firsts.get(name) != ident or name in inv.hosts:
            qualified = "%s_%s" % (meta.get("namespace"), name)
            inv.warnings.append("Machine %s: host name %s belongs to the older Machine %s, using %s"
                                % (ident, name, firsts.get(name), qualified))
            name = qualified
        md, mp = _deployment_and_pool(meta)
        bmh_meta = (bmh or {}).get("metadata") or {}
        cpu = hardware.get("cpu") or {}
        hostvars = {
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "api_version": machine.get("apiVersion"),
            "cluster": cluster,
            "phase": phase,
            "provider_id": spec.get("providerID"),
            "node_type": node_type,
            "node_ref": node_ref,
            "labels": labels,
            "annotations": meta.get("annotations") or {},
            "deleting": deleting,
            "deletion_timestamp": meta.get("deletionTimestamp"),
            "machine_deployment": md,
            "machine_set": labels.get(SET_LABEL) or _owner(meta, "MachineSet"),
            "machine_pool": mp,
            "address": address,
            "addresses": addresses,
            "metal3_machine": (m3m or {}).get("metadata", {}).get("name"),
            "bmh": bmh_meta.get("name"),
            "bmh_namespace": bmh_meta.get("namespace"),
            "cpus": cpu.get("count"),
            "ram_mib": hardware.get("ramMebibytes"),
            "nics": nics,
            "hostname": hardware.get("hostname"),
        }
        if opts.hostvars == "lean":
            hostvars["labels"] = _user_keys(labels)
            hostvars["annotations"] = _user_keys(hostvars["annotations"])
            hostvars = {k: hostvars[k] for k in LEAN_KEYS}
        vars_ = {opts.hostvar_name: hostvars}
        if address:
            vars_["ansible_host"] = address
        else:
            inv.warnings.append("Machine %s is being deleted and has no address: it is in group %s without "
                                "ansible_host" % (ident, opts.deleting_group))
        inv.hosts[name] = vars_
        if deleting:
            inv.add(opts.deleting_group, name)
        else:
            inv.add(group, name)
        if cluster:
            inv.add(sanitize_group("capi_cluster_" + cluster), name)
        for prefix, kind, owner in (("capi_md_", "MachineDeployment", md), ("capi_mp_", "MachinePool", mp)):
            if not owner:
                continue
            spaces = owners.get((kind, owner), ())
            if len(spaces) > 1:
                # one name in several namespaces: never one group for different owners
                if (kind, owner) not in warned:
                    warned.add((kind, owner))
                    inv.warnings.append("%s %s exists in namespaces %s: its groups are %s" % (
                        kind, owner, ", ".join(sorted(spaces)),
                        ", ".join(sanitize_group("%s%s_%s" % (prefix, ns, owner)) for ns in sorted(spaces))))
                inv.add(sanitize_group("%s%s_%s" % (prefix, meta.get("namespace"), owner)), name)
            else:
                inv.add(sanitize_group(prefix + owner), name)
    return inv


def pages_map_alone(machines, opts):
    """Whether mapping Machines page by page, with no Metal3 objects, gives what mapping them all at
    once does: no host name wanted by two Machines (the older keeps it, whatever page it is on) and
    no MachineDeployment or MachinePool name in two namespaces (their groups then name the namespace)."""
    machines = _in_clusters(machines, set(opts.clusters))
    names = set()
    for machine in machines:
        name = _base_name(machine, opts)
        if name in names:
            return False
        names.add(name)
    return all(len(spaces) == 1 for spaces in _owner_namespaces(machines).values())


def merge(parts):
    """One MappedInventory of several mapped in turn (pages of one list, in order)."""
    out = MappedInventory()
    for part in parts:
        out.hosts.update(part.hosts)
        for group, hosts in part.groups.items():
            out.groups.setdefault(group, []).extend(hosts)
        out.warnings.extend(part.warnings)
        out.skipped.update(part.skipped)
    return out


def _owner_namespaces(machines):
    """(MachineDeployment|MachinePool, name) -> the namespaces whose Machines name it."""
    out = {}
    for machine in machines:
        meta = machine.get("metadata") or {}
        for kind, owner in zip(("MachineDeployment", "MachinePool"), _deployment_and_pool(meta)):
            if owner:
                out.setdefault((kind, owner), set()).add(meta.get("namespace"))
    return out


_KEEP_META = ("name", "namespace", "uid", "labels", "annotations", "deletionTimestamp", "ownerReferences",
              "resourceVersion", "creationTimestamp")


def trim(obj, spec_keys=(), status_keys=()):
    """Only what the mapping reads: keeps the cache small and JSON-safe."""
    meta = obj.get("metadata") or {}
    out = {"apiVersion": obj.get("apiVersion"), "metadata": {k: meta[k] for k in _KEEP_META if k in meta}}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if spec_keys:
        out["spec"] = {k: spec[k] for k in spec_keys if k in spec}
    if status_keys:
        out["status"] = {k: status[k] for k in status_keys if k in status}
    return out


MACHINE_SPEC = ("clusterName", "providerID", "infrastructureRef")
MACHINE_STATUS = ("phase", "addresses", "nodeRef")
M3M_STATUS = ("addresses",)
BMH_STATUS = ("hardware",)
