"""The checkpoints of a run: snapshot modes, rotation, the newest valid one, quarantine (see :mod:`tdrl.ckpt`)."""

from __future__ import annotations

import builtins
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tdrl.ckpt.files import (
    CHECKPOINT_DIR,
    SNAPSHOT_MODES,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointInfo,
    CheckpointWarning,
    PathWriter,
    SnapshotMode,
    StrictResumeError,
    read_checkpoint,
    verify_checkpoint,
    write_checkpoint,
    write_error,
)
from tdrl.utils.files import LinkingWriter
from tdrl.utils.process import pid_alive

__all__ = ["Checkpointer"]


def _file_stats(path: Path) -> tuple[tuple[str, int, int, int], ...]:
    """(name, size, mtime, inode) of every file under ``path``: any rewrite, copy or truncation changes it."""
    stats = []
    for root, _, names in os.walk(path):
        for name in names:
            st = os.stat(os.path.join(root, name))
            stats.append((os.path.relpath(os.path.join(root, name), path), st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sorted(stats))


class Checkpointer:
    """Writes checkpoints into ``directory`` by snapshot mode (module docstring) and loads the newest valid one.

    ``strict``: a corrupt newest checkpoint raises :class:`CheckpointCorrupt` on load instead of a warning and a
    fallback to the previous valid one. Raises :class:`CheckpointError` when ``directory`` cannot be created.
    Building one and :meth:`newest_valid` change nothing in an existing ``directory``; temp dirs left by killed
    writers are removed by the first :meth:`save` or :meth:`load_latest`.
    """

    def __init__(self, directory: Path, *, snapshot_mode: SnapshotMode = "last", snapshot_gap: int = 10,
                 strict: bool = False) -> None:
        if snapshot_mode not in SNAPSHOT_MODES:
            raise ValueError(f"checkpoint.snapshot_mode={snapshot_mode!r} is not one of {list(SNAPSHOT_MODES)}")
        if snapshot_gap < 1:
            raise ValueError(f"checkpoint.snapshot_gap must be >= 1, got {snapshot_gap}")
        self.directory = Path(directory)
        self.snapshot_mode = snapshot_mode
        self.snapshot_gap = snapshot_gap
        self.strict = strict
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create checkpoint directory {self.directory}: {e}") from e
        self._verified: dict[Path, tuple[tuple, str | None]] = {}  # path -> (file stats, problem or None)
        self._stale_removed = False

    def will_save(self, iteration: int) -> bool:
        """Whether :meth:`save` writes anything for this iteration under the snapshot mode."""
        if self.snapshot_mode == "gap":
            return iteration % self.snapshot_gap == 0
        return self.snapshot_mode != "none"

    def list(self) -> list[CheckpointInfo]:
        """Published checkpoints (verified or not), oldest first."""
        found = []
        for entry in self.directory.iterdir():
            match = CHECKPOINT_DIR.match(entry.name)
            if match and entry.is_dir():
                found.append(CheckpointInfo(entry, int(match.group(1))))
        return sorted(found, key=lambda c: c.iteration)

    def verify(self, info: CheckpointInfo) -> str | None:
        """``None`` if the checkpoint matches its manifest, else what does not (the :class:`CheckpointCorrupt`
        message). The answer is remembered while the checkpoint's files are unchanged."""
        stats = _file_stats(info.path)
        known = self._verified.get(info.path)
        if known is not None and known[0] == stats:
            return known[1]
        try:
            verify_checkpoint(info.path)
            problem = None
        except CheckpointCorrupt as e:
            problem = str(e)
        self._verified[info.path] = (stats, problem)
        return problem

    def newest_valid(self) -> tuple[CheckpointInfo | None, builtins.list[str]]:
        """The newest checkpoint that verifies (``None`` if none does) and the problems of the newer ones, newest
        first. Reads only: nothing is moved or deleted."""
        problems: builtins.list[str] = []
        for info in reversed(self.list()):
            problem = self.verify(info)
            if problem is None:
                return info, problems
            problems.append(problem)
        return None, problems

    def save(self, state: Mapping[str, Any], iteration: int, *,
             extra_writers: Mapping[str, PathWriter | LinkingWriter] | None = None) -> Path | None:
        """Write a checkpoint if the snapshot mode says so (else return ``None``), then rotate old ones.

        :class:`LinkingWriter` entries link from the newest published checkpoint not known to be corrupt
        (:meth:`link_source`). Raises :class:`CheckpointError` if the write failed (disk full, read-only); earlier
        ones are untouched.
        """
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        if not self.will_save(iteration):
            return None
        self._remove_stale()
        target = self.directory / f"itr_{iteration:08d}"
        try:
            write_checkpoint(target, state, iteration=iteration, extra_writers=extra_writers,
                             previous=self.link_source())
        except Exception as e:
            os_error = _os_error_in_chain(e)  # torch.save reports ENOSPC as a RuntimeError
            if os_error is None:
                raise
            existing = [c for c in self.list() if c.path != target]
            raise write_error(target, os_error, existing[-1] if existing else None) from e
        self._rotate(keep=target)
        return target

    def link_source(self) -> Path | None:
        """The checkpoint a new one shares unchanged files with: the newest published one, skipping those whose
        last verification (:meth:`verify`) failed; ``None`` when there is none."""
        for info in reversed(self.list()):
            known = self._verified.get(info.path)
            if known is None or known[1] is None:
                return info.path
        return None

    def load_latest(
        self, *, map_location: str | torch.device = "cpu", extra_readers: Mapping[str, PathWriter] | None = None
    ) -> tuple[dict[str, Any], CheckpointInfo] | None:
        """Load the newest checkpoint that verifies (see :meth:`verify`); ``None`` if there is none.

        A corrupt newer checkpoint is named in a :class:`CheckpointWarning` and moved to ``corrupt/`` (so it is
        neither loaded nor overwritten later), unless ``strict``, which raises :class:`StrictResumeError` instead and
        changes nothing.
        """
        self._remove_stale()
        for info in reversed(self.list()):
            problem = self.verify(info)
            if problem is None:
                try:
                    state = read_checkpoint(info.path, map_location=map_location, extra_readers=extra_readers,
                                            verify=False)
                    return state, info
                except CheckpointCorrupt as e:
                    problem = str(e)
            if self.strict:
                raise StrictResumeError(f"{problem}; strict resume is on (checkpoint.strict_resume=true)")
            moved = self._quarantine(info)
            warnings.warn(f"CORRUPT CHECKPOINT SKIPPED: {problem}. Moved it to {moved}; falling back to the previous "
                          "one.", CheckpointWarning, stacklevel=2)
        return None

    def _remove_stale(self) -> None:
        """Remove temp and half-deleted dirs left by killed writers (ours only: their pid is gone); once."""
        if self._stale_removed:
            return
        self._stale_removed = True
        for entry in self.directory.iterdir():
            if entry.name.startswith(".del-"):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith(".tmp-"):
                pid = entry.name.rsplit("-", 2)[-2]
                if not (pid.isdigit() and pid_alive(int(pid))) or int(pid) == os.getpid():
                    shutil.rmtree(entry, ignore_errors=True)

    def _rotate(self, keep: Path) -> None:
        """Remove what the snapshot mode does not keep, never ``keep`` (just written) nor the newest other one."""
        mode = self.snapshot_mode
        if mode in ("all", "gap"):
            return
        others = [info for info in self.list() if info.path != keep]
        for info in others[:-1]:  # the newest other one stays: it is what a bad ``keep`` falls back to
            if mode == "last" or (mode == "gap_and_last" and info.iteration % self.snapshot_gap != 0):
                doomed = self.directory / f".del-{info.path.name}-{uuid.uuid4().hex[:8]}"
                # Rename first: a kill mid-delete leaves a .del- dir, never a half-deleted itr_ dir.
                os.rename(info.path, doomed)
                shutil.rmtree(doomed, ignore_errors=True)
                self._verified.pop(info.path, None)

    def _quarantine(self, info: CheckpointInfo) -> Path:
        corrupt = self.directory / "corrupt"
        corrupt.mkdir(exist_ok=True)
        target = corrupt / f"{info.path.name}-{time.strftime('%Y%m%d_%H%M%S')}-{uuid.uuid4().hex[:4]}"
        os.rename(info.path, target)
        self._verified.pop(info.path, None)
        return target


def _os_error_in_chain(exc: BaseException | None) -> OSError | None:
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
