"""Fixtures for the scheduler_state tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scheduler_state.helpers import require_hived


@pytest.fixture
def hived() -> Path:
    """The ../shared/hived folder, for the opt-in ``shared`` tests (``-m shared``); they
    skip cleanly when it is absent. The default suite uses examples/hived-features."""
    return require_hived()
