# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""converged.hpc.capi_scale in the controller's process when the task runs on the control node
(plugin_utils/in_process.py): autoscale.yml scales there."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.converged.hpc.plugins.module_utils.capi_scale import (
    SCALE_ARGUMENT_SPEC,
    scale_task,
)
from ansible_collections.converged.hpc.plugins.plugin_utils.in_process import InProcessAction


class ActionModule(InProcessAction):

    MODULE = "converged.hpc.capi_scale"
    SPEC = SCALE_ARGUMENT_SPEC
    work = staticmethod(scale_task)
