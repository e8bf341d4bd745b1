"""The machines tests' deployment (tests/machines/netns.py): created per test, removed after
it whatever happened."""

from __future__ import annotations

import pytest

from tests.machines.netns import Machines, require_netns


@pytest.fixture
def machines(request):
    require_netns()
    marker = request.node.get_closest_marker("machines_settings")
    m = Machines(marker.args[0] if marker else None)
    try:
        yield m.up()
    finally:
        m.close()
