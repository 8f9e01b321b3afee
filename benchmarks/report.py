"""``--markdown PATH``, shared by the benchmark scripts: the run's output as a dated docs page.

Measurements live in dated pages under ``docs/`` (the README links them), each saying on which machine, at which
commit and with which command its figures were measured. A script wraps its run in :func:`markdown_page`, which
takes ``--markdown PATH`` out of ``sys.argv`` and writes the page as the run prints (a run killed at a time limit
still leaves what it printed), then again whole at the end. Machine paths (this checkout, site-packages, the home
directory) are written as short placeholders: a page is read on other machines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

__all__ = ["add_markdown_option", "machine_line", "markdown_page", "scrub_paths"]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "torchrl", "tensordict", "gymnasium", "stable-baselines3", "envpool")


SITE_DIR = re.compile(r"/[^\s'\"():,]*?/(?:site|dist)-packages/")


def _clean(text: str) -> str:
    """Printed output as a page shows it: no terminal colour codes, no machine-specific paths."""
    return scrub_paths(re.sub(r"\x1b\[[0-9;]*m", "", text))


def scrub_paths(text: str) -> str:
    """``text`` with this machine's paths shortened: the checkout to paths relative to it, installed packages'
    directories (and ``PYTHONPATH`` entries) to ``<site>/``, the Python installation to ``<python>``, the home
    directory to ``~``."""
    text = SITE_DIR.sub("<site>/", text)
    entries = filter(os.path.isabs, os.environ.get("PYTHONPATH", "").split(os.pathsep))
    names = {f"{entry.rstrip('/')}/": "<site>/" for entry in entries if Path(entry) != REPO}
    names.update({prefix: "<python>" for prefix in {sys.prefix, sys.base_prefix} - {"/", "/usr"}})
    names.update({f"{REPO}/": "", str(REPO): ".", f"{Path.home()}/": "~/"})
    for path in sorted(names, key=len, reverse=True):  # the longest first: a venv inside the checkout is <python>
        text = text.replace(path, names[path])
    return text


class _Tee(io.TextIOBase):
    def __init__(self, *streams: io.TextIOBase) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


class _Scrubbed(io.TextIOBase):
    """Writes through to ``stream`` with :func:`scrub_paths`, flushed at once (the page so far, if the run dies)."""

    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_clean(text))
        self.stream.flush()
        return len(text)


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _gpu() -> str:
    try:
        import torch
    except ImportError:
        return "none"
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def machine_line() -> str:
    """CPU model, cores this process may use, memory, GPU and the load average."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{_cpu_model()}, {cores} cores, {_memory_gib():.0f} GiB, GPU: {_gpu()}; "
            f"load average {os.getloadavg()[0]:.2f}")


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def _versions() -> str:
    found = [f"Python {platform.python_version()}"]
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            found.append(f"{name} {metadata.version(name)}")
    return ", ".join(found)


def add_markdown_option(parser: argparse.ArgumentParser) -> None:
    """List ``--markdown PATH`` in a script's ``--help`` (:func:`markdown_page` takes it out of ``sys.argv`` before
    the script's own parser runs)."""
    parser.add_argument("--markdown", metavar="PATH", help="also write this run as a dated docs page at PATH "
                        "(machine, software, commit, command and the printed output)")


@contextlib.contextmanager
def markdown_page(title: str, argv: list[str] | None = None) -> Iterator[None]:
    """Run the body; with ``--markdown PATH`` in ``argv`` (default ``sys.argv``, from which it is removed) write
    ``PATH``: title and date, machine, software, commit, command, wall time, then everything printed."""
    argv = sys.argv if argv is None else argv
    if "--markdown" not in argv:
        yield
        return
    at = argv.index("--markdown")
    if at + 1 >= len(argv):
        raise SystemExit("--markdown needs a PATH")
    path = Path(argv[at + 1])
    del argv[at:at + 2]
    command = "python " + shlex.join([os.path.relpath(Path(argv[0]).resolve(), REPO), *argv[1:]])
    started, machine, captured = time.perf_counter(), machine_line(), io.StringIO()

    def page(wall: str, output: str, closed: bool) -> str:
        return "\n".join([
            f"# {title}, {datetime.date.today().isoformat()}", "",
            f"- Machine: {machine} at the start.",
            f"- Software: {_versions()}.",
            f"- Commit: {_commit()}.",
            f"- Command (from the repository root): `{command}`",
            f"- Wall time: {wall}.", "",
            "## Output", "", "```text", _clean(output).rstrip(),
            *(["```", ""] if closed else []),
        ])

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page("still running (the output so far)", "", closed=False) + "\n")
    with path.open("a") as partial, contextlib.redirect_stdout(_Tee(sys.stdout, captured, _Scrubbed(partial))):
        yield
    path.write_text(page(f"{time.perf_counter() - started:.0f} s", captured.getvalue(), closed=True))
    print(f"wrote {path}")
