"""``--markdown PAGE[#SECTION]``, shared by the benchmark scripts: the run's output as a section of a docs page.

Measurements live in one results page per topic under ``docs/`` (``throughput.md``, ``learning.md``, ...), each
section holding the newest run of one study and saying on which machine, at which commit and with which command its
figures were measured. A script wraps its run in :func:`markdown_page`, which takes ``--markdown PAGE[#SECTION]``
out of ``sys.argv`` and writes the run into that page **in place**: the block between the section's markers
(``<!-- results:SECTION -->`` ... ``<!-- /results:SECTION -->``) is replaced, everything else on the page (the
hand-written summary above a block, the other sections) is kept. ``SECTION`` defaults to the script's title as a
heading link (``Replay throughput`` -> ``replay-throughput``); a section not on the page yet goes under the heading
whose link it is, else it is added at the end under a new heading. A page with ``<!-- index -->`` markers gets the
table between them rewritten: one row per section with its date, commit, machine and command (the page's header).

The page is written as the run prints (a run killed at a time limit still leaves what it printed), then again whole
at the end. Machine paths (this checkout, site-packages, the home directory) are written as short placeholders: a
page is read on other machines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import io
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Protocol

__all__ = ["Heading", "add_markdown_option", "heading_link", "headings", "machine_line", "markdown_page", "scrub_paths",
           "write_section"]

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("torch", "torchrl", "tensordict", "gymnasium", "stable-baselines3", "envpool")
BLOCK = re.compile(r"<!-- results:(?P<id>[\w-]+) -->\n(?P<body>.*?)<!-- /results:(?P=id) -->", re.S)
INDEX = re.compile(r"<!-- index -->\n.*?<!-- /index -->", re.S)
HEADING = re.compile(r"^(#{1,6}) +(.+?) *$")


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


def heading_link(heading: str) -> str:
    """The anchor GitHub gives a heading: ``"Collectors: CPU, 2 cores"`` -> ``"collectors-cpu-2-cores"``."""
    text = re.sub(r"[`*_]|\[([^]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


class _Stream(Protocol):
    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class _Tee(io.TextIOBase):
    def __init__(self, *streams: _Stream) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


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
    """List ``--markdown PAGE[#SECTION]`` in a script's ``--help`` (:func:`markdown_page` takes it out of
    ``sys.argv`` before the script's own parser runs)."""
    parser.add_argument("--markdown", metavar="PAGE[#SECTION]",
                        help="also write this run into a section of a docs page, in place (date, machine, software, "
                        "commit, command and the printed output), e.g. docs/throughput.md#replay")


@dataclass
class Heading:
    level: int
    text: str
    start: int  # offset of the heading's line in the page
    end: int  # offset after it


def headings(page: str) -> list[Heading]:
    """The page's markdown headings, outside fenced code (a ``## versions`` line of printed output is none)."""
    found, fenced, offset = [], False, 0
    for line in page.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := HEADING.match(line)):
            found.append(Heading(len(m.group(1)), m.group(2), offset, offset + len(line)))
        offset += len(line)
    return found


def _section_end(page: str, heading: Heading) -> int:
    """Where the section that ``heading`` opens ends: at the next heading of its level or above, else the end."""
    return next((h.start for h in headings(page) if h.start > heading.start and h.level <= heading.level), len(page))


def write_section(page: str, section: str, title: str, body: str) -> str:
    """``page`` with the block ``section`` holding ``body``: replaced where the page has it, else put at the end of
    the section whose heading links to ``#section``, else added at the end under ``## title`` (a new page starts
    with ``# title``); then the page's index, if it has one, rewritten."""
    block = f"<!-- results:{section} -->\n{body.rstrip()}\n<!-- /results:{section} -->"
    found = next((m for m in BLOCK.finditer(page) if m.group("id") == section), None)
    heading = next((h for h in headings(page) if heading_link(h.text) == section), None)
    if found:
        page = page[:found.start()] + block + page[found.end():]
    elif heading:
        end = _section_end(page, heading)
        page = page[:end].rstrip() + f"\n\n{block}\n\n" + page[end:].lstrip()
    elif page.strip():
        page = page.rstrip() + f"\n\n## {title}\n\n{block}\n"
    else:
        page = f"# {title}\n\n{block}\n"
    return _with_index(page)


@dataclass
class _Measured:
    heading: str
    date: str
    commit: str
    machine: str
    command: str


def _measurements(page: str) -> list[_Measured]:
    """Each block's heading (the nearest above it) and its date, commit, machine (without the load) and command."""
    found, titles = [], headings(page)
    for block in BLOCK.finditer(page):
        above = [h.text for h in titles if h.start < block.start()]
        fields = dict(re.findall(r"^- (Date|Commit|Machine|Command)[^:]*: (.*)$", block.group("body"), re.M))
        found.append(_Measured(
            heading=above[-1] if above else block.group("id"),
            date=fields.get("Date", "?").split(";")[0].rstrip("."),
            commit=fields.get("Commit", "?").rstrip("."),
            machine=re.sub(r"[;,]? *load average [~\d.-]+( at the start)?", "", fields.get("Machine", "?")).rstrip("."),
            command=fields.get("Command", "?").split("; `--markdown")[0].rstrip(".")))
    return found


def _with_index(page: str) -> str:
    """``page`` with the table between its ``<!-- index -->`` markers rewritten from its blocks."""
    if not INDEX.search(page):
        return page
    rows = ["<!-- index -->", "| section | date | commit | machine | command |", "|---|---|---|---|---|"]
    rows += [f"| [{m.heading}](#{heading_link(m.heading)}) | {m.date} | {m.commit} | {m.machine} | {m.command} |"
             for m in _measurements(page)]
    return INDEX.sub(lambda _: "\n".join([*rows, "<!-- /index -->"]), page, count=1)


def _header(section: str, provenance: tuple[str, str, str, str, str], wall: str) -> list[str]:
    """The lines that open a block: ``provenance`` is (date, machine, software, commit, command)."""
    date, machine, software, commit, command = provenance
    return [
        f"- Date: {date}; wall time {wall}.",
        f"- Machine: {machine} at the start.",
        f"- Software: {software}.",
        f"- Commit: {commit}.",
        f"- Command (from the repository root): `{command}`; `--markdown <this page>#{section}` rewrites this "
        "block.",
    ]


def _parse_target(argv: list[str], title: str) -> tuple[Path, str]:
    """``--markdown PAGE[#SECTION]`` taken out of ``argv``: the page and the section (default: the title's link)."""
    at = argv.index("--markdown")
    if at + 1 >= len(argv):
        raise SystemExit("--markdown needs a PAGE[#SECTION]")
    target = argv[at + 1]
    del argv[at:at + 2]
    path, _, section = target.partition("#")
    section = section or heading_link(title)
    if not re.fullmatch(r"[\w-]+", section):
        raise SystemExit(f"--markdown {target}: a section is a heading's link (letters, digits, '-', '_')")
    return Path(path), section


class _Page(io.TextIOBase):
    """The page around a run's output, rewritten whole at each write: ``head``, the output so far, ``tail``."""

    def __init__(self, path: Path, head: str, tail: str) -> None:
        self.path, self.head, self.tail = path, head, tail
        self.output: list[str] = []
        self.flush_page()

    def write(self, text: str) -> int:
        self.output.append(_clean(text))
        self.flush_page()
        return len(text)

    def flush_page(self) -> None:
        _write_whole(self.path, self.head + "".join(self.output).rstrip() + self.tail)


def _write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` by a rename: a reader, or a run killed now, never sees half a page."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)


@contextlib.contextmanager
def markdown_page(title: str, argv: list[str] | None = None) -> Iterator[None]:
    """Run the body; with ``--markdown PAGE[#SECTION]`` in ``argv`` (default ``sys.argv``, from which it is removed)
    write the run into that section of ``PAGE`` (:func:`write_section`): date, machine, software, commit, command,
    wall time, then everything printed."""
    argv = sys.argv if argv is None else argv
    if "--markdown" not in argv:
        yield
        return
    path, section = _parse_target(argv, title)
    command = "python " + shlex.join([os.path.relpath(Path(argv[0]).resolve(), REPO), *argv[1:]])
    started, captured = time.perf_counter(), io.StringIO()
    provenance = (datetime.date.today().isoformat(), machine_line(), _versions(), _commit(), command)
    header = functools.partial(_header, section, provenance)
    before = path.read_text() if path.is_file() else ""
    marker = "\0output\0"  # where the output goes, in the page around it
    head, tail = write_section(before, section, title, "\n".join(
        [*header("still running (the output so far)"), "", "```text", marker, "(still running)", "```"])
    ).split(marker)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stdout(_Tee(sys.stdout, captured, _Page(path, head, tail))):
        yield
    body = [*header(f"{time.perf_counter() - started:.0f} s"), "", "```text", _clean(captured.getvalue()).rstrip(),
            "```"]
    _write_whole(path, write_section(before, section, title, "\n".join(body)))
    print(f"wrote {path}#{section}")
