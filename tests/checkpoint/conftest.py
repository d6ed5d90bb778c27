"""Fixtures shared by the checkpoint tests."""

from __future__ import annotations

import pytest
from harness.breakable import breakable_dir

from trainstore.checkpoint.save.staging import CLOSED_ARENAS


@pytest.fixture
def breakable(tmp_path):
    """A store directory whose writes fail between ``break_()`` and ``heal()`` (harness.breakable)."""
    yield from breakable_dir(tmp_path)


@pytest.fixture(autouse=True)
def no_closed_arenas():
    """Each test starts without staging memory a closed manager of an earlier test left for
    reuse (``staging.CLOSED_ARENAS``): allocation counts and fresh-arena checks stay exact."""
    CLOSED_ARENAS.drop()
    yield
    CLOSED_ARENAS.drop()
