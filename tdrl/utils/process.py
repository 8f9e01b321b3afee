"""Child-process supervision, one copy for every package that starts processes: liveness, dying with the parent,
closing what is still open at interpreter exit, and how long a child may take to start."""

from __future__ import annotations

import ast
import atexit
import ctypes
import inspect
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["START_TIMEOUT_S", "MainGuardError", "check_main_guard", "close_at_exit", "die_with_parent", "pid_alive",
           "watch_parent"]

START_TIMEOUT_S = 120.0
"""How long a child process (collector workers, an async collector) may take to build its envs and policy."""

_PR_SET_PDEATHSIG = 1


class MainGuardError(SystemExit):
    """Worker processes were about to start from a script's top level, outside ``if __name__ == "__main__":``.
    A ``SystemExit``: the script ends with the one line that says what to add (exit status 1), not with the page
    of tracebacks its workers would print."""


def check_main_guard(what: str) -> None:
    """Raise :class:`MainGuardError` (one line) when this call comes from the top level of the script being run
    (``python script.py``) outside an ``if __name__ == "__main__":`` block. Worker processes (``forkserver`` or
    ``spawn``) import that script again, so unguarded code would start workers from every worker; Python then
    fails with a page of tracebacks from the children. Scripts without a file (``python -c``, notebooks) pass."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    frame = inspect.currentframe()
    while frame is not None and not (frame.f_globals is getattr(main, "__dict__", None)
                                     and frame.f_code.co_name == "<module>" and frame.f_code.co_filename == path):
        frame = frame.f_back
    if frame is None or not path or not os.path.isfile(path):
        return
    line = frame.f_lineno
    try:
        with open(path) as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _tests_main_name(node.test) and \
                node.body[0].lineno <= line <= (node.body[-1].end_lineno or line):
            return
    raise MainGuardError(f"error: {what} starts worker processes, which import {os.path.basename(path)} again: "
                         f"put the code that builds it (line {line}) under `if __name__ == \"__main__\":`")


def _tests_main_name(test: ast.expr) -> bool:
    """Whether ``test`` is ``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and \
        any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)


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
