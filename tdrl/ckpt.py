"""Atomic, checksummed checkpoints with rlpyt's snapshot modes.

Not ``torch.save`` over the old file (rlpyt): a kill mid-write leaves an unloadable file. Not ``torchrl.checkpoint``:
it keeps no checksums, so a truncated tensor file loads as zeros. A checkpoint here is a directory written under a
temporary name, fsynced, then renamed into place, with a manifest of every file's sha256 and size. One that does
not match its manifest is never loaded: it is named in a warning, moved to ``corrupt/``, and the previous valid
one is used (``strict=True``: an error). A verified checkpoint is remembered while its files are unchanged (size,
mtime, inode), so checking before loading does not hash a large replay twice.

Layout of ``directory`` (usually ``<run_dir>/checkpoints``): ``itr_00000012/`` holding ``MANIFEST.json``,
``state.pt`` and one folder per ``extra_writers`` entry (e.g. a replay buffer's ``checkpoint_writer()``: its
``replay_state.pt`` and ``segments/``, see :mod:`tdrl.replay.segments`); ``.tmp-*`` folders being written (stale
ones are removed by the first save or load); ``corrupt/``.

Files shared between checkpoints: a :class:`LinkingWriter` is handed the same component's folder in the newest
published checkpoint and may hard-link files from it that its data has not changed since (a replay links the time
segments nothing was written to), so a checkpoint costs what changed, not the whole replay. A linked file is one
inode under several names: it is never written again (new data always goes to a new file), and rotating or
quarantining a checkpoint only renames or unlinks names, so a surviving checkpoint keeps every file it lists. The
manifest still lists every file with its sha256; a linked file whose size and mtime match the previous manifest's
entry carries that entry's sha256 instead of being read again (so the hashing cost follows the new data too), and
one that changed since it was published is not trusted: the component is written again without links. A shared
file corrupted in place fails the verification of every checkpoint that links it.

Snapshot modes (rlpyt's): ``none`` never writes; ``last`` keeps the newest two; ``all`` keeps every one; ``gap``
writes only when ``iteration % gap == 0``; ``gap_and_last`` keeps the multiples of ``gap`` plus the newest two.
Rotation never removes the two newest checkpoints: one bad file (a flipped bit, a truncated copy) in the newest
leaves the one before it to resume from, at the cost of twice the disk. Rotation runs after the new checkpoint is
published and renames before deleting, so a kill at any moment leaves at least one complete checkpoint once one
has been written.

Loading uses ``torch.load(weights_only=False)`` (checkpoints hold python values): only load checkpoints you
wrote. The checksum guards against corruption, not tampering.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from tdrl import __version__
from tdrl.utils.errors import UserError
from tdrl.utils.files import LinkingWriter, write_atomic
from tdrl.utils.process import pid_alive

__all__ = ["SNAPSHOT_MODES", "CheckpointCorrupt", "CheckpointError", "CheckpointInfo", "CheckpointWarning",
    "Checkpointer", "LinkingWriter", "PathWriter", "StrictResumeError", "read_checkpoint", "verify_checkpoint",
    "write_checkpoint"]

SnapshotMode = Literal["none", "last", "all", "gap", "gap_and_last"]
SNAPSHOT_MODES: tuple[str, ...] = get_args(SnapshotMode)
MANIFEST = "MANIFEST.json"
STATE_FILE = "state.pt"
FORMAT_VERSION = 1
_NAME = re.compile(r"^itr_(\d+)$")
_CHUNK = 1 << 20

PathWriter = Callable[[Path], Any]
"""Writes a component's files into the directory it is given (e.g. ``ReplayBuffer.dumps``)."""


class _SharedFileChanged(Exception):
    """A file linked from the previous checkpoint no longer matches that checkpoint's manifest entry."""


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read (disk full, unwritable directory, missing component)."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint's files do not match its manifest; the message names the checkpoint and the file."""


class StrictResumeError(CheckpointCorrupt, UserError):
    """Strict resume (``checkpoint.strict_resume``) refused a corrupt newest checkpoint: the user's setting, so a
    recipe ends with one line and exit status 2, having changed nothing."""


class CheckpointWarning(UserWarning):
    """A corrupt checkpoint was skipped in favour of an older one (or not shared from by a new one)."""


@dataclass(frozen=True)
class CheckpointInfo:
    """A published checkpoint directory and its iteration."""

    path: Path
    iteration: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_file(path: Path, fsync: bool = False) -> tuple[str, int]:
    """sha256 and size of a file; with ``fsync`` also forces its data to disk (one read, one fsync)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return digest.hexdigest(), size


def _write_error(target: Path, exc: OSError, previous: CheckpointInfo | None) -> CheckpointError:
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        reason += " (disk full)"
    kept = f"the previous checkpoint {previous.path} is intact" if previous else "no earlier checkpoint exists"
    return CheckpointError(f"could not write checkpoint {target}: {reason} [{exc}]; {kept}")


def _previous_files(previous: Path | None) -> dict[str, dict[str, Any]] | None:
    """The manifest entries of the checkpoint to link from, or ``None`` (none given, or its manifest unreadable)."""
    if previous is None:
        return None
    try:
        files = json.loads((previous / MANIFEST).read_text())["files"]
        return files if isinstance(files, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _entries(tmp: Path, component: Path, previous: Path | None,
             previous_files: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Manifest entries of the files under ``component``: a file linked unchanged from ``previous`` carries its
    sha256 from ``previous_files``; any other is hashed and fsynced. Raises :class:`_SharedFileChanged` when a
    linked file's size or mtime (or, in a manifest without mtimes, its content) differ from its published entry."""
    files = {}
    for root, _, filenames in os.walk(component):
        for fname in filenames:
            file = Path(root) / fname
            st = os.lstat(file)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(f"{file}: checkpoint files must be regular files (no symlinks)")
            rel = file.relative_to(tmp).as_posix()
            entry = previous_files.get(rel) if previous is not None else None
            shared = entry is not None and _same_inode(st, previous / rel)
            if shared and "mtime_ns" in entry:
                if (entry["size"], entry["mtime_ns"]) != (st.st_size, st.st_mtime_ns):
                    raise _SharedFileChanged(rel)
                files[rel] = {"sha256": entry["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
                continue
            sha, size = _hash_file(file, fsync=True)
            if shared and sha != entry["sha256"]:  # a manifest without mtimes: compare the content
                raise _SharedFileChanged(rel)
            files[rel] = {"sha256": sha, "size": size, "mtime_ns": os.stat(file).st_mtime_ns}
    return files


def _same_inode(st: os.stat_result, other: Path) -> bool:
    try:
        other_st = os.lstat(other)
    except OSError:
        return False
    return (other_st.st_dev, other_st.st_ino) == (st.st_dev, st.st_ino)


def _write_component(tmp: Path, name: str, writer: PathWriter | LinkingWriter, previous: Path | None,
                     previous_files: Mapping[str, dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Run one extra writer into ``tmp/name`` and return its manifest entries; a :class:`LinkingWriter` gets the
    component's folder in ``previous``, and runs again without it if a file it linked changed since."""
    directory = tmp / name
    link_from = previous / name if previous is not None and previous_files is not None else None
    if not isinstance(writer, LinkingWriter) or link_from is None or not link_from.is_dir():
        directory.mkdir()
        writer(directory)
        return _entries(tmp, directory, None, {})
    directory.mkdir()
    writer.write(directory, link_from)
    try:
        return _entries(tmp, directory, previous, previous_files)
    except _SharedFileChanged as e:
        warnings.warn(f"{previous / str(e)} changed after its checkpoint was written (corrupt?); writing {name!r} "
                      "again without sharing files with it", CheckpointWarning, stacklevel=4)
        shutil.rmtree(directory)
        directory.mkdir()
        writer(directory)
        return _entries(tmp, directory, None, {})


def write_checkpoint(path: Path, state: Mapping[str, Any], *, iteration: int,
                     extra_writers: Mapping[str, PathWriter | LinkingWriter] | None = None,
                     previous: Path | None = None) -> Path:
    """Write one checkpoint directory atomically: temp dir, fsync every file, manifest, rename, fsync parent.

    ``state`` is saved with ``torch.save``; each ``extra_writers[name](dir)`` writes its own files into ``dir``
    before the manifest is computed, so they are checksummed too. ``previous``: a published checkpoint whose
    files :class:`LinkingWriter` entries may link (see the module docstring). An existing ``path`` is replaced. A
    failed write raises (``OSError``, or ``RuntimeError`` from ``torch.save``) with nothing at ``path`` changed.
    """
    path = Path(path)
    extra_writers = dict(extra_writers or {})
    for name in extra_writers:
        if not name or "/" in name or name.startswith(".") or name in (MANIFEST, STATE_FILE):
            raise ValueError(f"extra writer name {name!r} must be a plain directory name")
    previous = Path(previous) if previous is not None else None
    previous_files = _previous_files(previous)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save(dict(state), f)
        files = _entries(tmp, tmp, None, {})
        for name, writer in extra_writers.items():
            files.update(_write_component(tmp, name, writer, previous, previous_files))
        manifest = {
            "format": FORMAT_VERSION, "iteration": int(iteration), "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "versions": {"torch": torch.__version__, "tdrl": __version__, "python": platform.python_version()},
            "files": dict(sorted(files.items())),
        }
        write_atomic(tmp / MANIFEST, json.dumps(manifest, indent=1))
        dirs = [Path(root) / d for root, dirnames, _ in os.walk(tmp) for d in dirnames]
        for d in [*reversed(dirs), tmp]:
            _fsync_dir(d)
        old = None
        if path.exists():  # the same iteration saved again: move the old one away, publish, then delete it
            old = path.parent / f".del-{path.name}-{uuid.uuid4().hex[:8]}"
            os.rename(path, old)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return path


def verify_checkpoint(path: Path) -> dict[str, Any]:
    """Check every file of a checkpoint against its manifest (size, then sha256) and return the manifest; raise
    :class:`CheckpointCorrupt` naming the checkpoint, the file, and the expected and actual values."""
    path = Path(path)
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise CheckpointCorrupt(f"checkpoint {path}: manifest {MANIFEST} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        if manifest.get("format") != FORMAT_VERSION or STATE_FILE not in files:
            raise ValueError(f"format {manifest.get('format')!r} or no {STATE_FILE} entry")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CheckpointCorrupt(f"checkpoint {path}: manifest {MANIFEST} is unreadable ({e})") from None
    for rel, expected in files.items():
        file = path / rel
        if not file.is_file():
            raise CheckpointCorrupt(f"checkpoint {path}: file {rel} is missing")
        size, want = file.stat().st_size, expected["size"]
        if size != want:
            raise CheckpointCorrupt(f"checkpoint {path}: file {rel} has {size} bytes, manifest says {want} "
                                    "(truncated?)")
        sha, want = _hash_file(file)[0], expected["sha256"]
        if sha != want:
            raise CheckpointCorrupt(f"checkpoint {path}: file {rel} sha256 {sha[:16]}... != manifest {want[:16]}...")
    return manifest


def read_checkpoint(path: Path, *, map_location: str | torch.device = "cpu",
                    extra_readers: Mapping[str, PathWriter] | None = None, verify: bool = True) -> dict[str, Any]:
    """Verify a checkpoint (unless the caller just did: ``verify=False``), load its state, and hand each extra
    component's directory to its reader.

    Raises:
        CheckpointCorrupt: see :func:`verify_checkpoint`, or ``state.pt`` does not unpickle.
        CheckpointError: a reader was given for a component this checkpoint does not contain.
    """
    path = Path(path)
    if verify:
        verify_checkpoint(path)
    try:
        state = torch.load(path / STATE_FILE, map_location=map_location, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the file is unusable
        raise CheckpointCorrupt(f"checkpoint {path}: {STATE_FILE} does not load ({type(e).__name__}: {e})") from e
    for name, reader in (extra_readers or {}).items():
        if not (path / name).is_dir():
            raise CheckpointError(f"checkpoint {path} has no component {name!r} (it was saved without it)")
        reader(path / name)
    return state


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
            match = _NAME.match(entry.name)
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

    def newest_valid(self) -> tuple[CheckpointInfo | None, list[str]]:
        """The newest checkpoint that verifies (``None`` if none does) and the problems of the newer ones, newest
        first. Reads only: nothing is moved or deleted."""
        problems = []
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
            raise _write_error(target, os_error, existing[-1] if existing else None) from e
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
