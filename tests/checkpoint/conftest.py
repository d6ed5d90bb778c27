"""Fixtures shared by the checkpoint tests."""

from __future__ import annotations

import pytest
from harness.breakable import breakable_dir


@pytest.fixture
def breakable(tmp_path):
    """A store directory whose writes fail between ``break_()`` and ``heal()`` (harness.breakable)."""
    yield from breakable_dir(tmp_path)
