# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: capi_machines
short_description: Cluster API Machines (and their Metal3 hosts) as inventory
version_added: 0.1.0
author: converged.hpc contributors (@converged-hpc)
description:
  - Reads C(Machine) objects (cluster.x-k8s.io, the preferred version the server offers, v1beta2 or v1beta1)
    from a Cluster API management cluster, joins them in memory with their C(Metal3Machine) and
    C(BareMetalHost) when Metal3 is installed, and groups them by their node-type label.
  - One paginated list per kind, never a request per Machine.
  - "Groups: C(<group_prefix><node-type>) for each node-type label value (controller, compute, login...),
    C(capi_cluster_<cluster>), C(capi_md_<MachineDeployment>), C(capi_mp_<MachinePool>) (with the namespace,
    C(capi_md_<namespace>_<name>), when several namespaces have one of that name), and
    C(capi_deleting) (O(deleting_group)) for Machines being deleted, which are in no node-type group."
  - Hostvars are C(ansible_host) and one dict (O(hostvar_name), default C(capi)) with the Machine's name,
    namespace, cluster, phase, node_type, labels, annotations, deleting, machine_deployment, machine_pool,
    and the Metal3 host's hostname, cpus and ram_mib; O(hostvars=full) adds the rest (provider_id, node_ref,
    the Metal3 host's name and NICs...).
  - The three kinds are listed at once, and each list asks for its next page while it decodes the last.
    Machines only (O(metal3=never), one list), each page's hosts are added while the server writes the next.
  - With O(cache), the cache holds the mapped hosts and groups, valid for the options they were mapped with.
  - Machines without the node-type label or without a usable address are skipped with a warning that
    names them; a label value that is not a valid group name is sanitised with a warning.
extends_documentation_fragment:
  - constructed
  - inventory_cache
  - kubernetes.core.k8s_auth_options
notes:
  - The connection options are kubernetes.core's own (M(kubernetes.core.k8s)), read the same way, including
    the C(K8S_AUTH_*) environment variables (C(K8S_AUTH_KUBECONFIG), C(K8S_AUTH_HOST), C(K8S_AUTH_API_KEY),
    C(K8S_AUTH_SSL_CA_CERT)...), several kubeconfig paths and the in-cluster service account.
  - The token is never printed; a trailing newline on it is removed.
requirements:
  - kubernetes (Python library)
  - kubernetes.core (collection)
  - netaddr (Python library, for O(nic_cidrs))
options:
  plugin:
    description: Marks the file as this plugin's configuration.
    required: true
    choices: [converged.hpc.capi_machines]
    type: str
  namespaces:
    description: Namespaces to read. Empty means all namespaces.
    type: list
    elements: str
    default: []
  clusters:
    description: Only Machines of these Cluster API clusters (label C(cluster.x-k8s.io/cluster-name)).
    type: list
    elements: str
    default: []
  label_selector:
    description: Extra Kubernetes label selector for Machines, for example C(node-type in (controller,compute)).
    type: str
  node_type_label:
    description: Machine label whose value names the host's group.
    type: str
    default: node-type
  group_prefix:
    description: Prefix for the node-type groups (C(slurm_) turns C(compute) into C(slurm_compute)).
    type: str
    default: ""
  phases:
    description:
      - Machine phases to include. A host that never becomes a Kubernetes Node (a Slurm-only host) stays
        C(Provisioned), so the default includes it.
    type: list
    elements: str
    default: [Running, Provisioned]
  include_deleting:
    description: Put Machines being deleted (deletionTimestamp set) in O(deleting_group) whatever their phase.
    type: bool
    default: true
  deleting_group:
    description: Group of Machines being deleted, for scale-down playbooks.
    type: str
    default: capi_deleting
  address_types:
    description: Machine address types to use for C(ansible_host), in order of preference.
    type: list
    elements: str
    default: [InternalIP, ExternalIP, Hostname]
  nic_names:
    description: For Metal3 hosts with several NICs, NIC names to take the address from, in order.
    type: list
    elements: str
    default: []
  nic_cidrs:
    description: For Metal3 hosts with several NICs, networks (CIDR) to take the address from, in order.
    type: list
    elements: str
    default: []
  host_naming:
    description:
      - Name hosts after the Machine, after its Kubernetes Node (nodeRef) when it has one, or after the host's
        own name (C(hostname)) - the Machine's C(Hostname) address, which CAPM3 copies from the BareMetalHost's
        hardware details - when it has one. Cluster API names a MachineDeployment's Machines after their
        MachineSet (C(<deployment>-<hash>-<random>)); C(hostname) names them as the hosts and Slurm know them.
      - When Machines of several namespaces would share a host name, the one created first keeps it and the
        others are named C(<namespace>_<name>), with a warning, so a new Machine never renames an existing host.
      - A name that is no valid host name (RFC 1123; whoever may edit a BareMetalHost's hardware details writes
        the C(hostname) one) skips its Machine, with a warning naming both.
    type: str
    choices: [machine, node, hostname]
    default: machine
  metal3:
    description:
      - Whether to read Metal3Machines and BareMetalHosts for hardware data.
      - C(auto) reads them when the API serves them and warns if it may not; C(always) fails instead;
        C(never) skips them.
    type: str
    choices: [auto, always, never]
    default: auto
  hostvar_name:
    description: Name of the per-host dict of Machine data.
    type: str
    default: capi
  hostvars:
    description:
      - What the per-host dict (O(hostvar_name)) holds.
      - C(lean) holds what this collection's roles and playbooks read, name, namespace, api_version,
        cluster, phase, node_type, labels, annotations, deleting, machine_deployment, machine_pool, hostname,
        cpus and ram_mib, where labels and annotations leave out Cluster API's own
        (C(cluster.x-k8s.io/*), C(machine-template-hash)) and C(kubectl.kubernetes.io/last-applied-configuration).
      - C(full) adds uid, provider_id, node_ref, deletion_timestamp, machine_set, address, addresses,
        metal3_machine, bmh, bmh_namespace and nics, and every label and annotation.
      - Ansible copies and tags every value an inventory sets, so each value costs time on every run;
        docs/inventory.md gives the measured cost per host.
    type: str
    choices: [lean, full]
    default: lean
  page_size:
    description: Items per list request (C(limit)); pages follow C(continue) tokens.
    type: int
    default: 500
  request_timeout:
    description: Seconds to wait for one API response.
    type: int
    default: 60
"""

EXAMPLES = r"""
# inventories/capi.capi_machines.yml: every Slurm machine of a Metal3 management cluster.
# The kubeconfig comes from $KUBECONFIG (or K8S_AUTH_KUBECONFIG in AWX).
plugin: converged.hpc.capi_machines
namespaces: [metal3]
clusters: [hpc]
# hosts with a 25G management NIC and a 200G fabric NIC: manage over the management network
nic_cidrs: [192.168.111.0/24]

---
# Only two node types, group names prefixed, cached for five minutes:
plugin: converged.hpc.capi_machines
label_selector: node-type in (controller,compute)
group_prefix: slurm_
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: /tmp/capi-inventory-cache
cache_timeout: 300

---
# Explicit API server and token (the token from the environment, never in the file):
plugin: converged.hpc.capi_machines
host: https://capi-mgmt.example.org:6443
ca_cert: /etc/pki/capi-mgmt-ca.pem
# api_key: taken from K8S_AUTH_API_KEY
keyed_groups:
  - key: capi.labels['slurm.example.org/partition'] | default('none')
    prefix: partition
compose:
  slurm_cpus: capi.cpus
"""

import gc
import json
import queue
from contextlib import contextmanager
from dataclasses import asdict

from ansible.errors import AnsibleError, AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible.utils.unsafe_proxy import wrap_var

try:  # ansible-core 2.19 and later: what an inventory plugin gives is never a template unless it says so
    from ansible.template import trust_as_template  # noqa: F401  pylint: disable=unused-import
    UNTRUSTED_BY_DEFAULT = True
except ImportError:  # before: a value is templated when a task reads it, unless marked unsafe
    UNTRUSTED_BY_DEFAULT = False

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (
    AUTH_OPTIONS,
    CAPI_GROUP,
    INFRA_GROUP,
    METAL3_GROUP,
    CapiApiError,
    CapiReader,
    build_configuration,
)
from ansible_collections.converged.hpc.plugins.module_utils.capi_mapping import (
    BMH_STATUS,
    M3M_STATUS,
    MACHINE_SPEC,
    MACHINE_STATUS,
    MappingOptions,
    build,
    merge,
    pages_map_alone,
    trim,
)

_HW_KEYS = ("cpu", "ramMebibytes", "nics", "hostname")
_CACHE_FORMAT = 2  # the cache holds mapped hosts and groups (format 1 held the API objects)


@contextmanager
def _no_cyclic_gc():
    """Python's cyclic garbage collector off while the lists are decoded and the hosts added.

    Decoding pages and adding hosts make millions of small objects, none in a cycle, and each
    full collection walks all those already kept: about a third of the run at 10,000 Machines
    (docs/benchmarks.md). Reference counting still frees everything; the collector is switched
    back on as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _trim_machine(obj):
    return trim(obj, MACHINE_SPEC, MACHINE_STATUS)


def _trim_m3m(obj):
    return trim(obj, (), M3M_STATUS)


def _trim_bmh(obj):
    small = trim(obj, (), BMH_STATUS)
    hw = small.get("status", {}).get("hardware") or {}
    small["status"] = {"hardware": {k: hw[k] for k in _HW_KEYS if k in hw}}
    return small


_END = object()


class _Stopped(Exception):
    """The hosts of the pages read so far could not be added: the list stops."""


class _Stream:
    """Machines only: each page's hosts are added while the server writes the next page.

    The list's thread hands each page over; this (the plugin's) thread maps it alone and adds its hosts
    and groups. Mapping page by page gives what mapping the whole list does unless two Machines want
    one host name or a MachineDeployment name is in two namespaces: the whole list tells (finish), and
    then everything added is taken back and the hosts are added from the whole list, as without a
    stream. A list that fails, or starts again (410), takes back what was added too: a failed source
    leaves no host behind."""

    def __init__(self, plugin, opts):
        self.plugin, self.opts = plugin, opts
        self.pages, self.broken, self.stopped = [], False, False
        self.groups_before = set(plugin.inventory.groups)
        self.queue = queue.Queue()

    def hand_over(self, items):
        """In the list's thread: a decoded page (None: the list starts again)."""
        if self.stopped:
            raise _Stopped()
        self.queue.put(items)

    def consume(self, fetch):
        """In the plugin's thread: add each page's hosts until the list ends; its result."""
        fetch.add_done_callback(lambda dummy: self.queue.put(_END))
        try:
            while True:
                items = self.queue.get()
                if items is _END:
                    break
                if items is None:
                    self.broken = True
                elif not self.broken:
                    part = build({"machines": items}, self.opts)
                    self.pages.append(part)
                    self.plugin._add_hosts(part.hosts, part.groups)
        except BaseException:
            self.stopped = True
            fetch.exception()  # the list ends at its next page
            self.take_back()
            raise
        try:
            return fetch.result()
        except BaseException:
            self.take_back()
            raise

    def finish(self, objects):
        """The mapped inventory, or None when the whole list maps otherwise (what was added is taken back)."""
        if self.broken or not pages_map_alone(objects["machines"], self.opts):
            self.take_back()
            return None
        return merge(self.pages)

    def take_back(self):
        inventory = self.plugin.inventory
        for name in [h for part in self.pages for h in part.hosts]:
            if name in inventory.hosts:
                inventory.remove_host(inventory.hosts[name])
        for name in [g for g in inventory.groups if g not in self.groups_before]:
            inventory.remove_group(inventory.groups[name])
            if name in inventory.groups:  # ansible-core before 2.19 removes a group by its name
                inventory.remove_group(name)
        self.pages = []


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "converged.hpc.capi_machines"

    def verify_file(self, path):
        return super(InventoryModule, self).verify_file(path) and path.endswith(
            ("capi_machines.yml", "capi_machines.yaml", "capi.yml", "capi.yaml"))

    def parse(self, inventory, loader, path, cache=True):
        super(InventoryModule, self).parse(inventory, loader, path, cache)
        self._read_config_data(path)
        with _no_cyclic_gc():
            self._parse(path, cache)

    def _parse(self, path, cache):
        opts = self._mapping_options()
        options = json.loads(json.dumps(asdict(opts)))
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        mapped = None
        if use_cache:
            try:
                cached = self._cache[cache_key]
            except KeyError:
                update_cache = True
            else:
                # the mapped hosts and groups, valid for the options they were mapped with
                if isinstance(cached, dict) and cached.get("format") == _CACHE_FORMAT and cached.get("options") == options:
                    mapped = cached
                else:
                    update_cache = True
        streamed = False
        if mapped is None:
            # Machines only, one list, into an inventory with no host yet: hosts are added page by page (_Stream)
            one_list = len(self.get_option("namespaces") or [None]) == 1
            stream = _Stream(self, opts) if self.get_option("metal3") == "never" and one_list \
                and not self.inventory.hosts else None
            inv = None
            try:
                objects = self._fetch_objects(stream)
                if stream is not None and stream.pages:
                    inv = stream.finish(objects)
                streamed = inv is not None
                if inv is None:
                    inv = build(objects, opts)
            except CapiApiError as exc:
                raise AnsibleError("converged.hpc.capi_machines (%s): %s" % (path, exc))
            except ValueError as exc:
                raise AnsibleParserError("converged.hpc.capi_machines: %s" % exc)
            mapped = {"format": _CACHE_FORMAT, "options": options, "hosts": inv.hosts, "groups": inv.groups,
                      "warnings": inv.warnings, "machines": len(objects.get("machines") or []),
                      "skipped": len(inv.skipped)}
        if update_cache:
            self._cache[cache_key] = mapped
        self._populate_inventory(mapped, added=streamed)

    def _mapping_options(self):
        page = self.get_option("page_size")
        if not isinstance(page, int) or page < 1:
            raise AnsibleParserError("converged.hpc.capi_machines: page_size must be a positive integer, got %r"
                                     % (page,))
        return MappingOptions(
            node_type_label=self.get_option("node_type_label"),
            group_prefix=self.get_option("group_prefix") or "",
            phases=tuple(self.get_option("phases") or ()),
            include_deleting=self.get_option("include_deleting"),
            deleting_group=self.get_option("deleting_group"),
            address_types=tuple(self.get_option("address_types") or ()),
            nic_names=tuple(self.get_option("nic_names") or ()),
            nic_cidrs=tuple(self.get_option("nic_cidrs") or ()),
            host_naming=self.get_option("host_naming"),
            clusters=tuple(self.get_option("clusters") or ()),
            hostvar_name=self.get_option("hostvar_name"),
            hostvars=self.get_option("hostvars"),
        )

    def _fetch_objects(self, stream=None):
        """API access: one paginated list per kind, trimmed to JSON-safe dicts. With a stream, the
        lists are read in a thread of their own while this one adds the hosts of each page."""
        configuration, headers = build_configuration(**{k: self.get_option(k) for k in AUTH_OPTIONS})
        reader = CapiReader(configuration, page_size=self.get_option("page_size"),
                            timeout=self.get_option("request_timeout"), headers=headers)
        try:
            if stream is None:
                return self._read_all(reader)
            fetch = reader.submit(self._read_all, reader, stream)
            return stream.consume(fetch)
        finally:
            self.display.vvv("converged.hpc.capi_machines: %d API requests to %s" % (reader.requests, reader.host))
            reader.close()

    def _read_all(self, reader, stream=None):
        version = reader.preferred_version(CAPI_GROUP)
        if version is None:
            raise CapiApiError("Cluster API is not installed at %s: the API group %s is not served"
                               % (reader.host, CAPI_GROUP))
        namespaces = self.get_option("namespaces") or [None]
        selector = self.get_option("label_selector") or ""
        clusters = self.get_option("clusters") or []
        if clusters:
            selector = ",".join(filter(None, [selector, "cluster.x-k8s.io/cluster-name in (%s)"
                                              % ",".join(clusters)]))
        mode = self.get_option("metal3")
        lists = {}
        for ns in namespaces:
            lists[("machines", ns)] = ((CAPI_GROUP, version, "machines", ns, selector or None),
                                       {"transform": _trim_machine, "managed_fields": False})
        metal3_error = None
        if mode != "never":
            try:
                infra_version = reader.preferred_version(INFRA_GROUP)
                bmh_version = reader.preferred_version(METAL3_GROUP)
            except CapiApiError as exc:
                metal3_error = exc
            else:
                if infra_version and bmh_version:
                    for ns in namespaces:
                        lists[("metal3machines", ns)] = ((INFRA_GROUP, infra_version, "metal3machines", ns),
                                                         {"transform": _trim_m3m, "managed_fields": False})
                        lists[("baremetalhosts", ns)] = ((METAL3_GROUP, bmh_version, "baremetalhosts", ns),
                                                         {"transform": _trim_bmh, "managed_fields": False})
                elif mode == "always":
                    metal3_error = CapiApiError("Metal3 is not installed at %s (metal3=always)" % reader.host)
                # not installed and metal3=auto: nothing to list, nothing to warn about
        if stream is not None:
            # the one list of Machines: its pages go to the stream as they are decoded
            lists[("machines", namespaces[0])][1]["on_page"] = stream.hand_over
        # the three kinds at once: the server lists them in parallel while this process decodes
        results = reader.list_many(lists)
        objects = {"machines": [], "metal3machines": [], "baremetalhosts": [],
                   "machine_api_version": "%s/%s" % (CAPI_GROUP, version)}
        for (kind, ns), items in results.items():
            if isinstance(items, CapiApiError):
                if kind == "machines" or mode == "always":
                    raise items
                metal3_error = metal3_error or items
                continue
            objects[kind].extend(items)
        if metal3_error is not None:
            if mode == "always":
                raise metal3_error
            self.display.warning("converged.hpc.capi_machines: no Metal3 hardware data (cpus, ram_mib, nics) "
                                 "in this inventory: %s" % metal3_error)
            objects["metal3machines"], objects["baremetalhosts"] = [], []
        return objects

    def _populate_inventory(self, mapped, added=False):
        """No API calls here: add the mapped hosts and groups (unless a stream has), then apply
        constructed options."""
        for warning in mapped["warnings"]:
            self.display.warning("converged.hpc.capi_machines: %s" % warning)
        if not added:
            self._add_hosts(mapped["hosts"], mapped["groups"])
        self.display.v("converged.hpc.capi_machines: %d hosts from %d Machines (%d skipped)" % (
            len(mapped["hosts"]), mapped["machines"], mapped["skipped"]))

    def _add_hosts(self, hosts, groups):
        for group in sorted(groups):
            self.inventory.add_group(group)
        strict = self.get_option("strict")
        compose, composed, keyed = self.get_option("compose"), self.get_option("groups"), self.get_option("keyed_groups")
        for host, hostvars in hosts.items():
            # what a Machine or a host carries (an annotation anyone who may edit it wrote) is data: never
            # rendered where the playbooks run, on any release
            hostvars = hostvars if UNTRUSTED_BY_DEFAULT else wrap_var(hostvars)
            self.inventory.add_host(host)
            for key, value in hostvars.items():
                self.inventory.set_variable(host, key, value)
            if compose:
                self._set_composite_vars(compose, hostvars, host, strict=strict)
            if composed:
                self._add_host_to_composed_groups(composed, hostvars, host, strict=strict)
            if keyed:
                self._add_host_to_keyed_groups(keyed, hostvars, host, strict=strict)
        for group, members in groups.items():
            for host in members:
                self.inventory.add_child(group, host)
