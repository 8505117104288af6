"""Debian programs some tests drive (Prometheus, Chromium), installed with apt-get when missing.

The README's test command is the whole CI, so a fresh Debian machine must not need anything
installed by hand: run as root with ``apt-get`` at hand, :func:`tool` installs the program's
package itself. Where installing is impossible (not root, no apt-get) the test is skipped on a
laptop and fails in CI.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

#: one apt-get at a time across test processes (dpkg's own lock fails rather than waits)
APT_LOCK = Path(tempfile.gettempdir()) / "prewarm-tests-apt.lock"
#: seconds apt-get waits for dpkg's lock when something outside the tests holds it
DPKG_LOCK_TIMEOUT_S = 300
_updated = False  # `apt-get update` runs once per test session


class InstallError(Exception):
    """apt-get could not install a package a test needs."""


def tool(name: str, package: str | None = None) -> str:
    """The path of the program ``name``, installing Debian's ``package`` (default ``name``) when
    it is missing and we may; skipped where installing is impossible, a failure in CI."""
    package = package or name
    found = shutil.which(name)
    if found is not None:
        return found
    if not _can_install():
        reason = f"{name} is not installed (apt-get install -y {package})"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        return install(name, package)
    except InstallError as exc:
        pytest.fail(str(exc))


def _can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def install(name: str, package: str) -> str:
    """Install ``package`` with apt-get (under a file lock) and return the path of ``name``."""
    with _apt_lock():
        found = shutil.which(name)  # another test process may have installed it meanwhile
        if found is None:
            _apt_update()
            _apt(["install", "-y", package], package)
            found = _installed_path(name, package)
    if found is None:
        raise InstallError(f"apt-get installed {package}, but it holds no program {name!r}")
    return found


@contextmanager
def _apt_lock() -> Iterator[None]:
    with APT_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _apt_update() -> None:
    global _updated
    if not _updated:
        _apt(["update"], "the package lists")
        _updated = True


def _apt(args: list[str], package: str) -> None:
    argv = ["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT_S}", *args]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        raise InstallError(
            f"could not install {package}: `{' '.join(argv)}` exited {done.returncode}\n{tail}"
        )


def _installed_path(name: str, package: str) -> str | None:
    """``name`` on the PATH, else among the package's files (``/usr/games`` is often off it)."""
    found = shutil.which(name)
    if found is not None:
        return found
    listed = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=False)
    for line in listed.stdout.splitlines():
        path = Path(line)
        if path.name == name and path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None
