"""Fail when a scenario's test secrets appear in its molecule output.

Reads the secret variables (munge_key, *_jwt_key, *_password, *_token, *_secret) that a
scenario's molecule.yml gives its inventory, and searches the log for each
value and, for base64 values, for the decoded bytes in hex and base64 forms.

    python3 tests/check_secrets.py molecule/cluster/molecule.yml .lab/logs/molecule-cluster.log
"""

import base64
import binascii
import re
import sys

import yaml

SECRET = re.compile(r"(munge_key|jwt_key|password|passwd|token|secret|auth_pass)$")


def secrets(node, out):
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and SECRET.search(str(key)) and len(value) >= 8:
                out.append((key, value))
            else:
                secrets(value, out)
    elif isinstance(node, list):
        for value in node:
            secrets(value, out)
    return out


def forms(value):
    yield value
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return
    yield raw.hex()
    yield base64.b64encode(raw).decode().rstrip("=")


def main(config, log):
    with open(config) as fh:
        found = secrets(yaml.safe_load(fh).get("provisioner", {}).get("inventory", {}), [])
    with open(log, errors="replace") as fh:
        text = fh.read()
    leaks = [key for key, value in found for form in forms(value) if form in text]
    if leaks:
        print("SECRET LEAK: %s appear(s) in %s" % (", ".join(sorted(set(leaks))), log))
        return 1
    print("secrets check: %d secret value(s) of %s absent from %s (%d bytes)" % (len(found), config, log, len(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
