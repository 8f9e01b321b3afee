"""The checkpoint format (see :mod:`tdrl.ckpt`): one directory written under a temporary name, fsynced and renamed
into place, with a manifest of every file's sha256 and size; verified before it is read."""


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

__all__ = ["SNAPSHOT_MODES", "CheckpointCorrupt", "CheckpointError", "CheckpointInfo", "CheckpointWarning",
    "PathWriter", "StrictResumeError", "read_checkpoint", "verify_checkpoint", "write_checkpoint"]

SnapshotMode = Literal["none", "last", "all", "gap", "gap_and_last"]
SNAPSHOT_MODES: tuple[str, ...] = get_args(SnapshotMode)
MANIFEST = "MANIFEST.json"
STATE_FILE = "state.pt"
FORMAT_VERSION = 1
CHECKPOINT_DIR = re.compile(r"^itr_(\d+)$")
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


def write_error(target: Path, exc: OSError, previous: CheckpointInfo | None) -> CheckpointError:
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
            if entry is not None and not (previous is not None and _same_inode(st, previous / rel)):
                entry = None  # not linked from the previous checkpoint: hashed like any new file
            if entry is not None and "mtime_ns" in entry:
                if (entry["size"], entry["mtime_ns"]) != (st.st_size, st.st_mtime_ns):
                    raise _SharedFileChanged(rel)
                files[rel] = {"sha256": entry["sha256"], "size": st.st_size, "mtime_ns": st.st_mtime_ns}
                continue
            sha, size = _hash_file(file, fsync=True)
            if entry is not None and sha != entry["sha256"]:  # a manifest without mtimes: compare the content
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
    if (not isinstance(writer, LinkingWriter) or previous is None or previous_files is None
            or not (previous / name).is_dir()):
        directory.mkdir()
        writer(directory)
        return _entries(tmp, directory, None, {})
    directory.mkdir()
    writer.write(directory, previous / name)
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
