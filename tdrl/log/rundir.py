"""Run-directory mechanics: naming, claiming, locking, writability probe, config files and their check on resume.

A run directory is ``<run.root>/<yyyymmdd>/<hhmmss>_<name>/run_<seed>/`` (rlpyt's ``logger_context`` layout,
with the seed as the run id), or exactly ``run.dir`` when given. Only an explicit ``run.dir`` is ever resumed:
an automatic name that already exists gets a ``_1``, ``_2`` suffix instead, so two launches in the same second
never share a directory. An explicit ``run.dir`` must be new, empty, or a run of tdrl's: an existing folder that
holds other files is refused unless ``run.force`` (a typo in ``run.dir`` would otherwise scatter a run's files
among someone else's).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import fnmatch
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from tdrl.config import ConfigError, RunConfig, diff_configs, flatten
from tdrl.utils.errors import NothingToDo, UserError
from tdrl.utils.files import write_json_atomic

__all__ = ["RunDirError", "RunFinished", "check_resume_config",
           "check_not_finished", "check_writable", "claim_run_dir", "config_dict", "lock_run_dir", "save_config",
           "sign_lock"]

CONFIG_FILE = "config.json"
PARAMS_FILE = "params.json"
SUMMARY_FILE = "summary.json"
_LAUNCH_FILES: tuple[str, ...] = (".lock", "variant.json", "launch.log", "launch_events.jsonl", "ray-*.log",
                                  ".ray-token-*")
"""What may be in a run directory before its run writes ``config.json``: the lock of a launch refused before it
(:func:`lock_run_dir`), and what ``tdrl.launch`` puts there before it starts the recipe (the variant, the local
launcher's log, the SLURM job's events, each node's Ray log and token)."""
_RESUME_IGNORED_KEYS: frozenset[str] = frozenset(
    {"run.dir", "run.root", "run.force", "logger.progress_bar", "logger.wandb_mode", "checkpoint.strict_resume"}
)
"""Keys that may differ between a run and its relaunch: where it lives and how it is watched, not what it computes."""


class RunDirError(UserError):
    """The run directory cannot be created or written, is in use by a live run, is a folder of other files, or
    holds unreadable run files (e.g. no loadable checkpoint left to resume from): bad input, so a recipe ends with
    one line and exit status 2."""


class RunFinished(NothingToDo):
    """The run directory holds a finished run (its ``summary.json``) and the relaunch's config is the run's: there is
    nothing to do, so nothing is changed (a recipe says so in one line and exits 0)."""


def config_dict(config: Any) -> dict[str, Any]:
    """A JSON-safe nested dict of a dataclass config or mapping (non-JSON values become their ``str``)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        nested = dataclasses.asdict(config)
    elif isinstance(config, Mapping):
        nested = dict(config)
    else:
        raise TypeError(f"config must be a dataclass instance or a mapping, got {type(config).__name__}")
    return json.loads(json.dumps(nested, default=str))


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "run"


def claim_run_dir(run: RunConfig, name: str) -> tuple[Path, bool]:
    """Create (or find) this run's directory: ``(directory, resumed)``, resumed when ``run.dir`` already holds a
    ``config.json``. Raises :class:`RunDirError` naming the directory and the reason when it cannot be created, or
    when ``run.dir`` is an existing folder of other files (no ``config.json``; anything beyond
    :data:`_LAUNCH_FILES`) and ``run.force`` is off; nothing is created then."""
    try:
        if run.dir:
            directory = Path(run.dir).expanduser().absolute()
            if directory.exists() and not directory.is_dir():
                raise RunDirError(f"run.dir={run.dir!r} is a file, not a directory; choose another run.dir")
            resumed = (directory / CONFIG_FILE).is_file()
            if not resumed and not run.force and (others := _other_files(directory)):
                more = f" and {len(others) - 1} more" if len(others) > 1 else ""
                raise RunDirError(f"run.dir={run.dir!r} is a folder of other files, not a tdrl run ({others[0]!r}"
                                  f"{more}); choose a new or empty run.dir, or pass run.force=true to write the run "
                                  "there anyway")
            directory.mkdir(parents=True, exist_ok=True)
            return directory, resumed
        day, second = time.strftime("%Y%m%d %H%M%S").split()
        base = Path(run.root).expanduser().absolute() / day / f"{second}_{_safe_name(name)}"
        base.mkdir(parents=True, exist_ok=True)
        for i in range(10_000):
            directory = base / (f"run_{run.seed}" if i == 0 else f"run_{run.seed}_{i}")
            try:
                directory.mkdir()  # atomic claim: concurrent launches never share a directory
                return directory, False
            except FileExistsError:
                continue
        raise RunDirError(f"no free run directory under {base}")
    except OSError as e:
        where = run.dir or run.root
        raise RunDirError(
            f"cannot create run directory under {where!r}: {e.strerror or e} ({e}); set run.root or run.dir "
            "to a writable location"
        ) from e


def _other_files(directory: Path) -> list[str]:
    """The names in ``directory`` (if it exists) that no run or launcher of tdrl put there, sorted."""
    if not directory.is_dir():
        return []
    names = sorted(entry.name for entry in directory.iterdir())
    return [n for n in names if not any(fnmatch.fnmatchcase(n, pattern) for pattern in _LAUNCH_FILES)]


def check_not_finished(directory: Path) -> None:
    """Raise :class:`RunFinished` when ``directory`` holds the ``summary.json`` of a finished run."""
    summary = Path(directory) / SUMMARY_FILE
    if summary.is_file():
        raise RunFinished(f"run {directory} already finished; nothing to do, nothing changed (summary: {summary})")


def lock_run_dir(directory: Path) -> IO[str]:
    """Take an exclusive lock on ``directory/.lock`` for as long as the returned file stays open.

    Two processes writing one run directory (a requeued job starting while the old one still runs, the same
    ``run.dir`` launched twice) would interleave rows and checkpoints. The lock is an ``flock``, so the kernel
    releases it when its holder dies, even by SIGKILL. Nothing is written yet (:func:`sign_lock` does once the
    launch goes ahead, so a refused resume changes nothing). Raises :class:`RunDirError` (with the holder's pid and
    host) when another live process holds it, or when the lock file cannot be created.
    """
    try:
        f = open(Path(directory) / ".lock", "a+")
    except OSError as e:
        raise RunDirError(f"run directory {directory} is not writable: {e.strerror or e} ({e}); set run.root or "
                          "run.dir to a writable location") from e
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise RunDirError(
            f"run directory {directory} is in use by another process ({holder}); wait for it to exit or "
            "choose another run.dir"
        ) from None
    return f


def sign_lock(lock: IO[str]) -> None:
    """Record this process as the holder of a lock from :func:`lock_run_dir` (named when another launch is refused)."""
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} on host {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    lock.flush()


def check_writable(directory: Path) -> None:
    """Write, fsync and delete a probe file, so a read-only or full disk fails now (:class:`RunDirError`), not at
    the first checkpoint."""
    probe = Path(directory) / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise RunDirError(f"run directory {directory} is not writable: {e.strerror or e} ({e}); set run.root or "
                          "run.dir to a writable location") from e
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


def check_resume_config(directory: Path, config: Mapping[str, Any], *, force: bool,
                        defaults: Mapping[str, Any] | None = None) -> dict[str, tuple]:
    """The dotted keys (``{key: (saved, now)}``) in which the saved ``config.json`` differs from the relaunch's
    config, ignoring :data:`_RESUME_IGNORED_KEYS`; empty if equal. A key the saved config lacks that the relaunch
    has at its value in ``defaults`` (the recipe's default config) is one a newer tdrl added, and a key the relaunch
    lacks is one it removed (a trainer key of a kind the recipe does not wire up): neither counts, and one line on
    stderr names them, so a sweep resumes across an upgrade.

    Raises:
        ConfigError: they differ and ``force`` is false; the message lists every differing key.
        RunDirError: ``config.json`` is unreadable.
    """
    path = Path(directory) / CONFIG_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RunDirError(f"cannot read {path} to resume this run: {e}") from e
    diff = {k: v for k, v in diff_configs(saved, dict(config)).items() if k not in _RESUME_IGNORED_KEYS}
    had, has = flatten(saved), flatten(dict(config))
    default = flatten(dict(defaults)) if defaults is not None else {}
    added = {k: now for k, (_, now) in diff.items() if k not in had and k in default and default[k] == now}
    removed = {k: was for k, (was, _) in diff.items() if k not in has}
    if added:
        print(f"tdrl: resuming with keys added since this run started, at their defaults: "
              f"{' '.join(f'{k}={v}' for k, v in added.items())}", file=sys.stderr, flush=True)
    if removed:
        print(f"tdrl: resuming without keys this recipe no longer has: "
              f"{' '.join(f'{k}={v}' for k, v in removed.items())}", file=sys.stderr, flush=True)
    diff = {k: v for k, v in diff.items() if k not in added and k not in removed}
    if diff and not force:
        lines = "\n".join(f"  {k}: saved {_shown(a)}, now {_shown(b)}" for k, (a, b) in diff.items())
        raise ConfigError(
            f"run directory {directory} holds a run with a different config; differing keys:\n{lines}\n"
            "Relaunch with the saved config to resume, pass run.force=true to resume anyway, or choose another run.dir."
        )
    return diff


def save_config(directory: Path, config: Mapping[str, Any], *, name: str, seed: int,
                diff: Mapping[str, tuple] | None = None) -> None:
    """Write ``config.json`` and ``params.json`` (plus ``name`` and ``run_ID``). ``diff`` is what a forced resume
    accepted (:func:`check_resume_config`); the config the run started with is then kept as
    ``config.before-<time>.json``."""
    if diff:
        shutil.copy2(directory / CONFIG_FILE, directory / f"config.before-{time.strftime('%Y%m%d_%H%M%S')}.json")
    write_json_atomic(directory / CONFIG_FILE, config)
    write_json_atomic(directory / PARAMS_FILE, {**config, "name": name, "run_ID": seed})


def _shown(value: Any) -> str:
    present = isinstance(value, (str, int, float, bool, list, dict, type(None)))
    return json.dumps(value) if present else "<absent>"
