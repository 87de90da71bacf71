# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""converged.hpc.machine_hook in the controller's process when the task runs on the control node
(plugin_utils/in_process.py): scale-up puts the hook there, scale-down releases it there."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.converged.hpc.plugins.module_utils.capi_hook import (
    HOOK_ARGUMENT_SPEC,
    hook_task,
)
from ansible_collections.converged.hpc.plugins.plugin_utils.in_process import InProcessAction


class ActionModule(InProcessAction):

    MODULE = "converged.hpc.machine_hook"
    SPEC = HOOK_ARGUMENT_SPEC
    work = staticmethod(hook_task)
