"""A Kubernetes workload cluster as Cluster API sees it: its API server (a real kube-apiserver in the lab
and the tests), where a Machine's Node appears once the host has booted, and where Cluster API drains
that Node before the Machine is deleted (cordon, evict every Pod on it, then delete the Node once the
host is gone). No kubelet runs: the simulator writes the Node a kubelet would register, with the host's
capacity (cpu, memory, and nvidia.com/gpu from the host's nvidia.com/gpu.count label, as GPU feature
discovery labels a node), and evictions delete at once (grace period 0)."""

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request


class WorkloadError(Exception):
    pass


class WorkloadCluster:
    def __init__(self, url, token, ca_cert=None):
        self.url = url.rstrip("/")
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_cert) if self.url.startswith("https") else None

    def request(self, method, path, body=None, content_type="application/json", query=None):
        url = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        headers = {"Accept": "application/json", "Authorization": "Bearer " + self.token}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        req = urllib.request.Request(url, method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                status, payload = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, payload = err.code, err.read()
        return status, (json.loads(payload) if payload else None)

    def ok(self, method, path, body=None, content_type="application/json", query=None, expect=(200, 201)):
        status, data = self.request(method, path, body, content_type, query)
        if status not in expect:
            raise WorkloadError("%s %s: %s %s" % (method, path, status, (data or {}).get("message", data)
                                                  if isinstance(data, dict) else data))
        return data

    # ------------------------------------------------------------------ what a kubelet and CAPI do
    def register_node(self, name, labels, cpus, ram_mib, extended=None):
        """The Node a kubelet registers for the host, Ready, with its capacity (idempotent)."""
        status, current = self.request("GET", "/api/v1/nodes/" + name)
        if status == 404:
            current = self.ok("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                        "metadata": {"name": name, "labels": labels}})
        elif status != 200:
            raise WorkloadError("GET node %s: %s" % (name, status))
        capacity = {"cpu": str(cpus), "memory": "%dMi" % ram_mib, "pods": "110"}
        capacity.update({k: str(v) for k, v in (extended or {}).items()})
        current["status"] = {"capacity": capacity, "allocatable": dict(capacity),
                             "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                             "message": "kubelet is posting ready status"}]}
        self.ok("PUT", "/api/v1/nodes/%s/status" % name, current)

    def cordon(self, name):
        self.ok("PATCH", "/api/v1/nodes/" + name, {"spec": {"unschedulable": True}},
                "application/merge-patch+json")

    def pods_on(self, name):
        items = self.ok("GET", "/api/v1/pods", query={"fieldSelector": "spec.nodeName=" + name})["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def evict(self, pod):
        meta = pod["metadata"]
        self.ok("POST", "/api/v1/namespaces/%s/pods/%s/eviction" % (meta["namespace"], meta["name"]),
                {"apiVersion": "policy/v1", "kind": "Eviction",
                 "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                 "deleteOptions": {"gracePeriodSeconds": 0}}, expect=(200, 201, 404))

    def delete_node(self, name):
        self.ok("DELETE", "/api/v1/nodes/" + name, expect=(200, 404))

    def drain(self, name):
        """Cordon, then evict every Pod on the Node until none is left; returns the Pods evicted."""
        self.cordon(name)
        evicted = []
        for dummy in range(20):
            pods = self.pods_on(name)
            if not pods:
                return evicted
            for pod in pods:
                self.evict(pod)
                evicted.append("%s/%s" % (pod["metadata"]["namespace"], pod["metadata"]["name"]))
        raise WorkloadError("node %s: Pods still there after 20 rounds of evictions" % name)
