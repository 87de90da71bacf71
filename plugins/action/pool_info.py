# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""converged.hpc.pool_info in the controller's process when the task runs on the control node
(plugin_utils/in_process.py): move.yml's waits read the pool there every second."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.converged.hpc.plugins.module_utils.capi_pool import (
    POOL_INFO_ARGUMENT_SPEC,
    pool_info_task,
)
from ansible_collections.converged.hpc.plugins.plugin_utils.in_process import InProcessAction


class ActionModule(InProcessAction):

    MODULE = "converged.hpc.pool_info"
    SPEC = POOL_INFO_ARGUMENT_SPEC
    work = staticmethod(pool_info_task)
