"""The tick event source: a first event at once, then one per interval; bad settings named."""

import asyncio
import os
import stat
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
    assert {e["tick"]["interval"] for _t, e in out.events} == {1.0}
    offsets = [t - start for t, _e in out.events]
    assert offsets[0] < 0.5 and 0.9 < offsets[1] < 1.5 and 1.9 < offsets[2] < 2.5


@pytest.mark.parametrize("args, message", [({"interval": "soon"}, "interval 'soon' is not a number"),
                                           ({"interval": 0.2}, "interval 0.2 is below 1 second"),
                                           ({"limit": "x"}, "limit 'x' is not a whole number")])
def test_bad_settings_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        tick.settings(args)


def test_the_stamp_is_a_private_file_of_the_sources_name_emptied_at_its_start(tmp_path, monkeypatch):
    monkeypatch.setattr(tick.tempfile, "gettempdir", lambda: str(tmp_path))
    seen = []

    class Looker(Collector):
        async def put(self, event):
            path = event["tick"]["stamp"]
            info = os.stat(path)
            seen.append((path, stat.S_IMODE(info.st_mode), info.st_size))
            with open(path, "w") as fh:  # as autoscale.yml records a full run
                fh.write("%f\n" % time.time())
            await super().put(event)

    for _run in (1, 2):
        asyncio.run(tick.main(Looker(), {"interval": 1, "limit": 2, "name": "auto scale/x"}))
    # one file for the source's name, private, empty at each start (a record of the last life is no answer)
    assert len({p for p, _m, _s in seen}) == 1
    assert [m for _p, m, _s in seen] == [0o600] * 4
    assert [s for _p, _m, s in seen][::2] == [0, 0] and all(s > 0 for _p, _m, s in seen[1::2])
    assert seen[0][0] == str(tmp_path / ("converged-hpc-tick-%d" % os.getuid()) / "auto_scale_x")
    directory = os.stat(os.path.dirname(seen[0][0]))
    assert stat.S_IMODE(directory.st_mode) == 0o700 and directory.st_uid == os.getuid()


def test_a_stamp_directory_others_may_write_to_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(tick.tempfile, "gettempdir", lambda: str(tmp_path))
    shared = tmp_path / ("converged-hpc-tick-%d" % os.getuid())
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="%s is not a private directory" % shared):
        tick.make_stamp("autoscale")
    assert list(shared.iterdir()) == []
