"""Run the simulator: python3 -m capisim --objects objects.yaml --token admin=SECRET"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading

import yaml

from .capi_controller import CapiController, Provisioner
from .server import Identity, Simulator
from .store import Store
from .workload import WorkloadCluster


class CommandProvisioner(Provisioner):
    """Boots and removes hosts with a command (words split as a shell would):
    `CMD machine-add MACHINE NODE_TYPE [USER_DATA_FILE]` prints "hostname address cpus ram_mib"
    on its last line (the file holds the Machine's bootstrap data, when it has any);
    `CMD machine-remove HOSTNAME`. The lab's is `python3 lab/machines.py`."""

    def __init__(self, command):
        self.command = shlex.split(command)

    def _boot(self, args, user_data, what):
        """Run a boot command with the bootstrap data in a file (mode 0600) as its last argument; its
        last line is "hostname address cpus ram_mib"."""
        with tempfile.NamedTemporaryFile(prefix="bootstrap-", suffix=".data") as data:
            if user_data is not None:
                data.write(user_data)
                data.flush()
                args = args + [data.name]
            proc = subprocess.run(args, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError("%s exited %d: %s" % (what, proc.returncode, proc.stderr.strip()[-500:]))
        hostname, address, cpus, ram = proc.stdout.strip().splitlines()[-1].split()
        return hostname, address, int(cpus), int(ram)

    def provision(self, machine_name, node_type, user_data=None):
        return self._boot(self.command + ["machine-add", machine_name, node_type], user_data, "machine-add")

    def release(self, hostname):
        subprocess.run(self.command + ["machine-remove", hostname], check=True, capture_output=True, text=True)

    def provision_host(self, host, address, machine_name, node_type, user_data=None):
        """`CMD machine-boot HOST ADDRESS NODE_TYPE [USER_DATA_FILE]`: a pool's host booted anew."""
        return self._boot(self.command + ["machine-boot", host, address, node_type], user_data,
                          "machine-boot %s for %s" % (host, machine_name))


def parse_workload(spec):
    """CLUSTER=URL,TOKEN_FILE[,CA_FILE] -> (cluster, WorkloadCluster); the token is read from its file."""
    cluster, sep, rest = spec.partition("=")
    parts = rest.split(",")
    if not sep or not cluster or len(parts) not in (2, 3) or not parts[0].startswith(("http://", "https://")):
        raise SystemExit("--workload %r: expected CLUSTER=URL,TOKEN_FILE[,CA_FILE]" % spec)
    with open(parts[1]) as fh:
        token = fh.read().strip()
    return cluster, WorkloadCluster(parts[0], token, parts[2] if len(parts) == 3 else None)


READONLY_RULES = {("cluster.x-k8s.io", "machines", verb) for verb in ("get", "list", "watch")}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="capisim", description=__doc__)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=6443)
    ap.add_argument("--objects", action="append", default=[], help="YAML file of objects to load (repeatable)")
    ap.add_argument("--token-file", help="file holding the admin bearer token (kept out of argv)")
    ap.add_argument("--readonly-token-file", help="file holding a token that may only get/list/watch Machines")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--pid-file")
    ap.add_argument("--capi-controller", metavar="PROVISIONER_CMD",
                    help="run the Cluster API controller; hosts are booted/removed with this command")
    ap.add_argument("--deprovision-seconds", type=float, default=0.0,
                    help="how long a pool's BareMetalHost stays deprovisioning before it is available again")
    ap.add_argument("--workload", action="append", default=[], metavar="CLUSTER=URL,TOKEN_FILE[,CA_FILE]",
                    help="a Kubernetes workload cluster's API: its Machines get Nodes there, drained on deletion")
    args = ap.parse_args(argv)
    workloads = dict(parse_workload(spec) for spec in args.workload)

    tokens = {}
    if args.token_file:
        tokens[open(args.token_file).read().strip()] = Identity("admin")
    if args.readonly_token_file:
        tokens[open(args.readonly_token_file).read().strip()] = Identity("machine-reader", READONLY_RULES)
    store = Store()
    for path in args.objects:
        with open(path) as fh:
            store.load(list(yaml.safe_load_all(fh)))
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    sim = Simulator(store, tokens, host=args.bind, port=args.port, tls=tls)
    if args.pid_file:
        with open(args.pid_file, "w") as fh:
            fh.write(str(os.getpid()))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    sim.start()
    controller = None
    if args.capi_controller:
        controller = CapiController(store, CommandProvisioner(args.capi_controller),
                                    deprovision_seconds=args.deprovision_seconds, workloads=workloads).start()
    print(f"capisim serving {sum(len(v) for v in store.objects.values())} objects on {sim.url}", flush=True)
    while not done.wait(5):
        if controller is not None and controller.errors:
            for err in controller.errors:
                print("capi-controller: " + err, flush=True)
            controller.errors.clear()
    if controller is not None:
        controller.stop()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
