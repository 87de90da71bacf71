"""The plugin switches Python's cyclic garbage collector off while it reads and maps, and back as it was."""

import gc

import pytest

from ansible_collections.converged.hpc.plugins.inventory.capi_machines import _no_cyclic_gc


@pytest.mark.parametrize("before", [True, False])
def test_collector_restored_as_it_was(before):
    (gc.enable if before else gc.disable)()
    try:
        with _no_cyclic_gc():
            assert not gc.isenabled()
        assert gc.isenabled() is before
        with pytest.raises(RuntimeError):
            with _no_cyclic_gc():
                raise RuntimeError("a failed list")
        assert gc.isenabled() is before
    finally:
        gc.enable()
