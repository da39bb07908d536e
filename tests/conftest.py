"""All tiers: nothing writes to the user's cache (the trainer caches measured ceilings there).
One cache per test session, shared by every tier: measuring a ceiling costs ~1 s."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def session_cache_dir(tmp_path_factory):
    """$TENSORPILOT_CACHE points at a per-session temporary directory, never ~/.cache."""
    path = tmp_path_factory.mktemp("tensorpilot-cache")
    old = os.environ.get("TENSORPILOT_CACHE")
    os.environ["TENSORPILOT_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("TENSORPILOT_CACHE", None)
    else:
        os.environ["TENSORPILOT_CACHE"] = old
