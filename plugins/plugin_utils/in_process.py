# -*- coding: utf-8 -*-
# Copyright: converged.hpc contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An action plugin that does its module's work in the controller's process when the task runs there.

The lifecycle playbooks talk to the management cluster from the control node (delegate_to: localhost):
take the Lease, put or release the deletion hook. As module runs each costs about 0.6 - 1 s on 2 cores
(AnsiballZ, a Python process and its imports) for one to three requests. An action plugin built on
InProcessAction validates the task's arguments against the module's own spec and calls the same
function the module calls (in module_utils), in the task's worker process. A task that runs anywhere
else (another host, not delegated), or that sets an environment (K8S_AUTH_* for the module, say), runs
the module, as before.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.plugins.action import ActionBase


class InProcessAction(ActionBase):
    """Subclasses set MODULE (the module's FQCN), SPEC (its argument spec) and work(params, check_mode),
    the function both run: a result dict, with failed and msg when it failed."""

    TRANSFERS_FILES = False
    MODULE = None
    SPEC = {}

    @staticmethod
    def work(params, check_mode):  # pragma: no cover - every subclass sets it
        raise NotImplementedError

    def run(self, tmp=None, task_vars=None):
        result = super(InProcessAction, self).run(tmp, task_vars)
        del tmp  # nothing is copied to a target
        # the task's environment keyword reaches a module's process, not this one: a module run then
        environment = self._task.environment
        if getattr(self._connection, "transport", None) != "local" or any(
                environment if isinstance(environment, list) else [environment]):
            result.update(self._execute_module(module_name=self.MODULE, module_args=self._task.args,
                                               task_vars=task_vars))
            return result
        # unknown, missing or badly typed arguments fail here (AnsibleActionFail), before any request
        params = self.validate_argument_spec(argument_spec=self.SPEC)[1]
        result.update(self.work(params, bool(self._play_context.check_mode)))
        result.setdefault("changed", False)
        return result
