"""Debian programs some tests drive (``.ci/run`` installs them with apt-get)."""

from __future__ import annotations

import os
import shutil

import pytest


def tool(name: str, package: str | None = None) -> str:
    """The path of ``name``; skipped on a machine without it, a failure in CI."""
    found = shutil.which(name)
    if found is None:
        reason = f"{name} is not installed (apt-get install -y {package or name})"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return found
