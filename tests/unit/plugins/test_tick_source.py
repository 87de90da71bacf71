"""The tick event source: a first event at once, then one per interval; bad settings named."""

import asyncio
import time

import pytest

from ansible_collections.converged.hpc.extensions.eda.plugins.event_source import tick


class Collector:
    def __init__(self):
        self.events = []

    async def put(self, event):
        self.events.append((time.monotonic(), event))


def test_ticks_on_a_fixed_grid():
    out = Collector()
    start = time.monotonic()
    asyncio.run(tick.main(out, {"interval": 1, "limit": 3, "name": "autoscale"}))
    assert [e["tick"]["index"] for _t, e in out.events] == [0, 1, 2]
    assert {e["tick"]["name"] for _t, e in out.events} == {"autoscale"}
    assert {e["tick"]["interval"] for _t, e in out.events} == {1.0}  # autoscale.yml skips a stale tick by it
    offsets = [t - start for t, _e in out.events]
    assert offsets[0] < 0.5 and 0.9 < offsets[1] < 1.5 and 1.9 < offsets[2] < 2.5


@pytest.mark.parametrize("args, message", [({"interval": "soon"}, "interval 'soon' is not a number"),
                                           ({"interval": 0.2}, "interval 0.2 is below 1 second"),
                                           ({"limit": "x"}, "limit 'x' is not a whole number")])
def test_bad_settings_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        tick.settings(args)
