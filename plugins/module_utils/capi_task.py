# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A task against the management cluster written once: an argument spec and a function of the validated
arguments and check mode that returns the task's result (with failed and msg when it failed); api_task
gives it a client and turns the client's failures into that result.

The module runs it through module_main; its action plugin (plugin_utils/in_process.py) calls the same
function in Ansible's own process when the task runs on the control node. The lease and machine_hook
modules are built so.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.basic import AnsibleModule

try:
    from ansible_collections.kubernetes.core.plugins.module_utils.args_common import AUTH_ARG_SPEC
except ImportError:  # pragma: no cover - kubernetes.core comes with the ansible package
    AUTH_ARG_SPEC = {}

from ansible_collections.converged.hpc.plugins.module_utils.capi_client import (
    CapiApiError,
    CapiReader,
    build_configuration,
)


def with_auth(spec):
    """The spec with kubernetes.core's connection options (host, api_key, kubeconfig, context...)."""
    out = dict(spec)
    out.update(AUTH_ARG_SPEC)
    return out


def api_task(params, label, work):
    """work(reader) with a client built from params' connection options: its result, or a failed result
    with one clear line (the API's, or the label and the error's type: never a traceback with a credential)."""
    reader = None
    try:
        configuration, headers = build_configuration(**{k: params.get(k) for k in AUTH_ARG_SPEC})
        reader = CapiReader(configuration, timeout=30, headers=headers)
        return work(reader)
    except CapiApiError as exc:
        return dict(failed=True, msg=str(exc))
    except Exception as exc:  # never a traceback with a credential in it
        return dict(failed=True, msg="%s: %s" % (label, type(exc).__name__))
    finally:
        if reader is not None:
            reader.close()


def module_main(argument_spec, work):
    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    result = work(module.params, module.check_mode)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)
