"""The API resources the simulator serves, as the real CRDs declare them.

The table mirrors the CustomResourceDefinitions of Cluster API, CAPM3 and the
Bare Metal Operator (names, kinds, short names, categories, served versions
with the preferred one first, subresources), plus the few built-in kinds the
collection touches (namespaces, secrets, configmaps, leases).
tests/unit/test_capisim_resources.py checks it against the real CRD files.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core group
    plural: str
    kind: str
    versions: tuple  # served versions, preferred first
    namespaced: bool = True
    short_names: tuple = ()
    categories: tuple = ()
    subresources: tuple = ("status",)
    singular: str = ""
    list_kind: str = field(default="")
    # a kind the API server has in its own code (typed): written in its fields' order; a custom
    # resource (a CRD's) is an unstructured map, written with its keys sorted at every level
    builtin: bool = False

    @property
    def preferred(self):
        return self.versions[0]

    @property
    def group_resource(self):
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version):
        return f"{self.group}/{version}" if self.group else version


CAPI = "cluster.x-k8s.io"
INFRA = "infrastructure.cluster.x-k8s.io"
METAL3 = "metal3.io"
_CAPI_VERSIONS = ("v1beta2", "v1beta1")

RESOURCES = (
    Resource("", "namespaces", "Namespace", ("v1",), namespaced=False, short_names=("ns",),
             subresources=("status",), singular="namespace", builtin=True),
    Resource("", "secrets", "Secret", ("v1",), subresources=(), singular="secret", builtin=True),
    Resource("", "configmaps", "ConfigMap", ("v1",), short_names=("cm",), subresources=(),
             singular="configmap", builtin=True),
    Resource("coordination.k8s.io", "leases", "Lease", ("v1",), subresources=(), singular="lease", builtin=True),
    Resource(CAPI, "clusters", "Cluster", _CAPI_VERSIONS, short_names=("cl",),
             categories=("cluster-api",), singular="cluster"),
    Resource(CAPI, "machinedeployments", "MachineDeployment", _CAPI_VERSIONS, short_names=("md",),
             categories=("cluster-api",), subresources=("scale", "status"), singular="machinedeployment"),
    Resource(CAPI, "machinepools", "MachinePool", _CAPI_VERSIONS, short_names=("mp",),
             categories=("cluster-api",), subresources=("scale", "status"), singular="machinepool"),
    Resource(CAPI, "machines", "Machine", _CAPI_VERSIONS, short_names=("ma",),
             categories=("cluster-api",), singular="machine"),
    Resource(CAPI, "machinesets", "MachineSet", _CAPI_VERSIONS, short_names=("ms",),
             categories=("cluster-api",), subresources=("scale", "status"), singular="machineset"),
    Resource(INFRA, "metal3clusters", "Metal3Cluster", _CAPI_VERSIONS,
             short_names=("m3c", "m3cluster", "m3clusters", "metal3c", "metal3cluster"),
             categories=("cluster-api",), singular="metal3cluster"),
    Resource(INFRA, "metal3datas", "Metal3Data", _CAPI_VERSIONS,
             short_names=("m3d", "m3data", "m3datas", "metal3d", "metal3data"),
             categories=("cluster-api",), singular="metal3data"),
    Resource(INFRA, "metal3datatemplates", "Metal3DataTemplate", _CAPI_VERSIONS,
             short_names=("m3dt", "m3datatemplate", "m3datatemplates", "metal3dt", "metal3datatemplate"),
             categories=("cluster-api",), singular="metal3datatemplate"),
    Resource(INFRA, "metal3machines", "Metal3Machine", _CAPI_VERSIONS,
             short_names=("m3m", "m3machine", "m3machines", "metal3m", "metal3machine"),
             categories=("cluster-api",), singular="metal3machine"),
    # not among ../shared/k8s/crds: names as CAPM3's CRD declares them; templates have no status
    Resource(INFRA, "metal3machinetemplates", "Metal3MachineTemplate", _CAPI_VERSIONS,
             short_names=("m3mt", "m3machinetemplate", "m3machinetemplates", "metal3mt", "metal3machinetemplate"),
             categories=("cluster-api",), subresources=(), singular="metal3machinetemplate"),
    Resource(METAL3, "baremetalhosts", "BareMetalHost", ("v1alpha1",), short_names=("bmh", "bmhost"),
             singular="baremetalhost"),
)


def by_kind(resources=RESOURCES):
    return {(r.group, r.kind): r for r in resources}
