"""Run the simulator: python3 -m capisim --objects objects.yaml --token admin=SECRET"""

import argparse
import os
import signal
import sys
import threading

import yaml

from .server import Identity, Simulator
from .store import Store

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
    args = ap.parse_args(argv)

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
    print(f"capisim serving {sum(len(v) for v in store.objects.values())} objects on {sim.url}", flush=True)
    done.wait()
    sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
