"""Ctrl-C and SIGTERM end a recipe with one line that says how to resume it.

A recipe's command line (:func:`tdrl.config.run_recipe`) raises SIGTERM as the same exception as Ctrl-C (a
``KeyboardInterrupt``), so the same cleanup runs: the trainer stops its worker processes and closes the run; the
checkpoints already written are complete (they are published atomically). Then one line on stderr names the signal
and the command that resumes the run, the same arguments plus ``run.dir=<its directory>`` (which
:meth:`tdrl.log.Run.open` reports with :func:`note_run_dir`), and the process exits with ``128 + signal`` (130 for
SIGINT, 143 for SIGTERM), as a shell reports a process killed by it. ``TDRL_DEBUG=1`` keeps the traceback.

Inside a trainer's loop SIGTERM waits for the next iteration boundary (:class:`SigtermAtBoundary`, one policy for
every trainer): the trainer checkpoints there, then raises :class:`Interrupted`, so a preempted run resumes from
the iteration it was in, not from its last interval checkpoint. Ctrl-C, and a second SIGTERM, interrupt at once.

Worker processes ignore SIGINT (:func:`ignore_sigint`): a terminal's Ctrl-C reaches the whole process group, and
only the main process decides how they stop.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypedDict

__all__ = ["Interrupted", "SigtermAtBoundary", "ignore_sigint", "interrupts_end_in_one_line", "keeps_signal_handlers",
           "note_run_dir", "noted_run_dir"]


class _State(TypedDict):
    run_dir: str | None  # the run this process has open (note_run_dir)
    signum: int | None  # the signal that interrupted it


_state: _State = {"run_dir": None, "signum": None}


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGINT) received while a recipe runs; raised like Ctrl-C so the same cleanup runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def note_run_dir(path: str | os.PathLike) -> None:
    """Record the directory of the run this process has open: the one an interrupted launch resumes."""
    _state["run_dir"] = str(Path(path).absolute())


def noted_run_dir() -> str | None:
    """The directory :func:`note_run_dir` recorded (``None`` before a run is open): where its ``debug.log`` is."""
    return _state["run_dir"]


def ignore_sigint() -> None:
    """In a worker process: leave Ctrl-C to the main process, which stops the workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _python() -> str:
    """How to name this interpreter in a command the user can paste: ``python`` when that is the one on PATH."""
    on_path = shutil.which("python")
    if on_path and Path(on_path).resolve() == Path(sys.executable).resolve():
        return "python"
    return sys.executable


def _resume_command(script: str, args: Sequence[str], run_dir: str | os.PathLike) -> str:
    """``python <script> <args> run.dir=<run_dir>``, without any ``run.dir`` the args had, quoted for a shell."""
    kept = [a for a in args if not a.lstrip("-").startswith("run.dir=")]
    return shlex.join([_python(), script, *kept, f"run.dir={Path(run_dir).absolute()}"])


def _raise_interrupted(signum: int, frame: object) -> None:
    _state["signum"] = signum
    raise Interrupted(signum)


class SigtermAtBoundary:
    """The SIGTERM policy of every trainer: while armed (its loop runs), SIGTERM asks the loop to stop at its next
    iteration boundary instead of interrupting whatever it is doing; the trainer checkpoints there (its checkpoint
    condition includes :attr:`requested`) and calls :meth:`stop_here`, which raises :class:`Interrupted`: a recipe's
    command line then ends with the resume line and exit status 143. A second SIGTERM interrupts at once, as Ctrl-C
    (never deferred) does. Arming does nothing outside the main thread (signal handlers belong to it) or when
    ``enabled`` is false (data-parallel ranks, which would have to agree on the boundary)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.requested = False
        self._previous: Any = None
        self._armed = False

    def arm(self) -> None:
        """Defer SIGTERM to the next boundary until :meth:`disarm` (call it where the loop starts)."""
        if self._armed or not self.enabled or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, self._later)
        self._armed = True

    def disarm(self) -> None:
        """Put back the SIGTERM handler :meth:`arm` replaced (call it where the loop ends, however it ends)."""
        if self._armed:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._armed = False

    def _later(self, signum: int, frame: object) -> None:
        if self.requested:  # a second SIGTERM: the sender will not wait
            _raise_interrupted(signum, frame)
        self.requested = True
        _state["signum"] = signum  # whatever ends the run from here on ends with the resume line

    def stop_here(self, *, final: bool = False) -> None:
        """At an iteration boundary, after its checkpoint: raise :class:`Interrupted` if SIGTERM asked to stop
        (not at the ``final`` boundary: the run is complete and finishes)."""
        if self.requested and not final:
            raise Interrupted(signal.SIGTERM)


@contextlib.contextmanager
def interrupts_end_in_one_line(script: str, args: Sequence[str]) -> Iterator[None]:
    """Run the enclosed recipe with SIGINT and SIGTERM raising :class:`Interrupted`; once one has arrived, whatever
    the cleanup raised ends as one line ``error: interrupted by SIG...; resume with: ...`` and exit 128 + signal."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return
    _state.update({"run_dir": None, "signum": None})
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except BaseException as e:
        signum = _state["signum"] or (e.signum if isinstance(e, Interrupted)  # a trainer's own, at a round's end
                                      else signal.SIGINT if isinstance(e, KeyboardInterrupt) else None)
        if signum is None or isinstance(e, SystemExit) or os.environ.get("TDRL_DEBUG", "") not in ("", "0"):
            raise
        name = signal.Signals(signum).name
        run_dir = _state["run_dir"]
        if run_dir is None:  # not opened yet, or opened by another process (rank 0 of a spawned ddp run)
            line = (f"interrupted by {name}; if a run directory was printed above, resume with: "
                    f"{_resume_command(script, args, '<that directory>')}")
        else:
            line = f"interrupted by {name}; resume with: {_resume_command(script, args, run_dir)}"
        print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(128 + int(signum)) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def keeps_signal_handlers() -> Iterator[None]:
    """Put back the SIGTERM and SIGINT handlers the enclosed code replaced. ``ray.init`` installs its own SIGTERM
    handlers (a Python ``sys.exit`` and a native one that prints a stack and aborts), which would skip the run's
    SIGTERM checkpoint and end a preempted SLURM job with SIGABRT instead of the one-line resume command."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back from here
                signal.signal(sig, handler)
