"""Child-process supervision, one copy for every package that starts processes: liveness, dying with the parent,
closing what is still open at interpreter exit, and how long a child may take to start."""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["START_TIMEOUT_S", "close_at_exit", "die_with_parent", "pid_alive", "watch_parent"]

START_TIMEOUT_S = 120.0
"""How long a child process (collector workers, an async collector) may take to build its envs and policy."""

_PR_SET_PDEATHSIG = 1


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (one owned by another user counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Run in a child before exec: the kernel sends it ``sig`` when its parent dies (Linux's PR_SET_PDEATHSIG; a
    no-op elsewhere), so a launcher killed by SIGKILL leaves no orphan."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):
        pass


def watch_parent(parent: int, poll_s: float, on_orphaned: Callable[[], None]) -> None:
    """Call ``on_orphaned`` in a daemon thread once process ``parent`` is no longer this process's parent (a
    parent killed by SIGKILL has no time to stop its children)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        on_orphaned()

    threading.Thread(target=watch, name="tdrl-parent-watch", daemon=True).start()


def close_at_exit(close: Callable[[Any], Any]) -> weakref.WeakSet:
    """A registry whose live members get ``close(member)`` at interpreter exit. Registered on import of the caller,
    after multiprocessing's own handler, so it runs first: children are stopped before multiprocessing joins them."""
    live: weakref.WeakSet = weakref.WeakSet()

    @atexit.register
    def _close_all() -> None:
        for member in list(live):
            close(member)

    return live
