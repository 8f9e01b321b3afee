"""Copy everything printed to ``debug.log`` (rlpyt's text log), while it still reaches the terminal.

Only python-level writes to ``sys.stdout``/``sys.stderr`` are copied (prints, warnings, tracebacks), not C
extensions or child processes writing to the raw file descriptors.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import IO, Any

__all__ = ["DebugLog"]


class _TeeStream:
    """A text stream that writes to the original stream and to the log file."""

    def __init__(self, original: IO[str], log: IO[str]) -> None:
        self.original = original
        self._log: IO[str] | None = log

    def write(self, text: str) -> int:
        n = self.original.write(text)
        if self._log is not None:
            self._log.write(text)
        return n if n is not None else len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self.original.flush()
        if self._log is not None:
            self._log.flush()

    def detach_log(self) -> None:
        self._log = None

    # isatty, fileno, encoding, ... behave like the original stream's.
    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


class DebugLog:
    """Tee ``sys.stdout`` and ``sys.stderr`` into ``path`` (appending) until :meth:`close`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")
        self._stdout = _TeeStream(sys.stdout, self._file)
        self._stderr = _TeeStream(sys.stderr, self._file)
        sys.stdout, sys.stderr = self._stdout, self._stderr

    @property
    def terminal_stderr(self) -> IO[str]:
        """The stderr the tee wraps: progress bars write there so their ``\\r`` updates stay out of the log."""
        return self._stderr.original

    def close(self) -> None:
        """Stop copying and restore the streams (if nothing replaced them since); idempotent."""
        if self._file.closed:
            return
        for name, tee in (("stdout", self._stdout), ("stderr", self._stderr)):
            tee.flush()
            tee.detach_log()  # if someone wrapped our tee, it keeps working as a plain pass-through
            if getattr(sys, name) is tee:
                setattr(sys, name, tee.original)
        self._file.close()
