"""Replay data in a checkpoint as time segments: only the filled part of each field is written, and a segment that
nothing was written to since the previous checkpoint is hard-linked from it instead of written again.

Why: a field's file has the buffer's full capacity (a 1M-frame Atari replay is 7.5 GB), while a checkpoint's new data
is what was collected since the one before. Copying whole files made every checkpoint cost the capacity.

A field ``[B, L, ...]`` of a :class:`~tdrl.replay.storage.MemmapStore` has a time axis of ``L`` entries and a
*cursor*, declared in the store's ``meta["cursors"]`` (:func:`field_cursors`): the entries written so far to each
stream, entry ``a`` living at ``a % L``. The axis is cut into segments of ``S`` entries (about ``segment_bytes``
each); segment ``k`` is the file ``<field>.<k>.bin`` holding ``field[:, kS : kS + n]`` stream after stream, ``n``
the entries of it ever written. Its *version* is, per stream, the newest entry written into it; its bytes depend on
nothing else, so a later dump finding the same version in the previous checkpoint links that file. A field without
a cursor (a small counter) is written whole every time.

Versions compare only within one history of writes, a *lineage* (:class:`Lineage`): loading a dump starts a new one
that remembers the dump's lineage and the cursors it was loaded at, so the first checkpoint after a resume still
links what is unchanged since the loaded checkpoint, and never what a lost run wrote after it. ``index.json`` holds
the lineage, the cursors and every segment's version and length.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tdrl.replay.schema import ReplayError
from tdrl.replay.storage import MemmapStore

__all__ = ["SEGMENT_BYTES", "Lineage", "field_cursors", "read_segments", "segment_plan", "write_segments"]

SEGMENT_BYTES = 16 << 20
"""Target size of one segment file (all streams): a checkpoint rewrites at most about two of them per field beyond
its new data, and a 7.5 GB field makes about 450 files."""
INDEX = "index.json"
_FORMAT = 1
_MAX_ANCESTORS = 8


@dataclass
class Lineage:
    """The dumps whose segments this store's data matches: those of ``token`` (every version), and those of each
    ancestor token for versions older than the cursors the store was loaded at (``ancestors[token][field]``)."""

    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    ancestors: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def limit(self, token: str, name: str) -> float | list[int] | None:
        """Per-stream cursors of field ``name`` below which the versions of ``token``'s dumps match this data
        (``inf``: all of them, ``token`` is this lineage); ``None`` if none do."""
        if token == self.token:
            return math.inf
        return self.ancestors.get(token, {}).get(name)

    @classmethod
    def after_load(cls, index: dict[str, Any]) -> Lineage:
        """A new lineage for a store just loaded from the dump ``index`` describes."""
        ancestors = {**index["ancestors"], index["token"]: index["cursors"]}
        return cls(ancestors=dict(list(ancestors.items())[-_MAX_ANCESTORS:]))


def field_cursors(store: MemmapStore) -> dict[str, np.ndarray | None]:
    """Per field, the entries written to each stream (int64 ``[B]``), or ``None`` for a field written whole.

    ``meta["cursors"][name]`` is an ``int`` ``s`` (the field holds one entry every ``s`` ring steps: the cursor is
    ``ceil(write_started / s)``) or the name of a ``[B, 1]`` int64 counter field (per-stream cursors).
    """
    assert store.meta is not None  # the store is allocated
    declared = store.meta.get("cursors", {})
    started = store.counter("write_started")
    out: dict[str, np.ndarray | None] = {}
    for name, tensor in store.fields.items():
        spec, streams = declared.get(name), tensor.shape[0]
        if isinstance(spec, int):
            out[name] = np.full(streams, -(-started // spec), dtype=np.int64)
        elif isinstance(spec, str):
            out[name] = store.fields[spec][:, 0].numpy().astype(np.int64)
        else:
            out[name] = None
    return out


def segment_plan(length: int, cursor: np.ndarray | None, segment: int) -> list[tuple[int, int, list[int] | None]]:
    """``(k, n, versions)`` of the segments of a time axis of ``length`` entries holding data: segment ``k`` starts
    at ``k * segment``, ``n`` of its entries were ever written (in some stream), ``versions`` is the newest entry
    written into it per stream (-1: none; ``None``: no cursor, one segment of the whole axis)."""
    if cursor is None:
        return [(0, length, None)]
    lo = np.arange(0, length, segment, dtype=np.int64)[None, :]
    hi = np.minimum(lo + segment, length)
    c = np.asarray(cursor, dtype=np.int64)[:, None]
    last = c - 1
    wraps, pos = last // length, last % length
    version = np.where(pos >= hi, wraps * length + hi - 1, np.where(pos >= lo, last, (wraps - 1) * length + hi - 1))
    version = np.maximum(version, -1)
    filled = np.where(c >= length, hi - lo, np.clip(c - lo, 0, hi - lo)).max(axis=0)
    return [(k, int(n), version[:, k].tolist()) for k, n in enumerate(filled) if n > 0]


def _segment_length(array: np.ndarray, segment_bytes: int) -> int:
    step_bytes = array.shape[0] * array[:1, :1].nbytes
    return int(min(array.shape[1], max(1, segment_bytes // max(step_bytes, 1))))


def _read_index(directory: Path) -> dict[str, Any] | None:
    try:
        index = json.loads((directory / INDEX).read_text())
    except (OSError, ValueError):
        return None
    return index if isinstance(index, dict) and index.get("format") == _FORMAT else None


def _linkable(before: dict[str, Any] | None, lineage: Lineage, name: str, array: np.ndarray,
              segment: int) -> dict[int, tuple[int, list[int]]]:
    """Segments of field ``name`` in the previous dump whose bytes this data still has: ``k -> (n, versions)``;
    a segment of this dump with the same ``(n, versions)`` links its file."""
    old = before["fields"].get(name) if before is not None else None
    limit = lineage.limit(before["token"], name) if before is not None else None
    if old is None or limit is None:
        return {}
    if (old["shape"], old["dtype"], old["segment"]) != (list(array.shape), str(array.dtype), segment):
        return {}
    return {k: (n, versions) for k, n, versions in old["segments"]
            if versions is not None and np.all(np.asarray(versions) < np.asarray(limit))}


def _link(source: Path, target: Path, size: int) -> bool:
    """Hard-link ``source`` as ``target`` if it has ``size`` bytes; False when it does not or linking fails (no
    hard links on this file system, too many links): the caller writes the data instead."""
    try:
        if source.stat().st_size != size:
            return False
        os.link(source, target)
    except OSError:
        return False
    return True


def write_segments(store: MemmapStore, directory: Path, previous: Path | None, lineage: Lineage,
                   segment_bytes: int = SEGMENT_BYTES) -> dict[str, Any]:
    """Write the filled segments of every field of ``store`` into ``directory`` (new), linking those of
    ``previous`` (an earlier ``directory``, never modified) that this data has unchanged; returns the index."""
    directory.mkdir(parents=True)
    before = _read_index(previous) if previous is not None else None
    cursors = field_cursors(store)
    fields = {}
    for name, tensor in store.fields.items():
        array = tensor.numpy()
        segment = _segment_length(array, segment_bytes)
        linkable = _linkable(before, lineage, name, array, segment)
        entries = []
        for k, n, versions in segment_plan(array.shape[1], cursors[name], segment):
            file, lo = f"{name}.{k:05d}.bin", k * segment
            nbytes = array[:, lo : lo + n].nbytes
            if (previous is None or linkable.get(k) != (n, versions)  # nothing is linkable without a previous dump
                    or not _link(previous / file, directory / file, nbytes)):
                with open(directory / file, "xb") as f:  # a new inode: never one a checkpoint links
                    for stream in array:
                        f.write(stream[lo : lo + n])
            entries.append([k, n, versions])
        fields[name] = {"shape": list(array.shape), "dtype": str(array.dtype), "segment": segment,
                        "segments": entries}
    index = {"format": _FORMAT, "token": lineage.token, "ancestors": lineage.ancestors,
             "cursors": {name: c.tolist() for name, c in cursors.items() if c is not None}, "fields": fields}
    (directory / INDEX).write_text(json.dumps(index))
    return index


def read_segments(store: MemmapStore, directory: Path) -> Lineage:
    """Copy the segments :func:`write_segments` wrote into ``store`` (allocated with the dump's layout, its other
    entries zero) and return the lineage the store continues."""
    index = _read_index(directory)
    if index is None:
        raise ReplayError(f"{directory / INDEX} is missing or unreadable")
    for name, spec in index["fields"].items():
        array = store.fields[name].numpy() if name in store.fields else None
        if array is None or (list(array.shape), str(array.dtype)) != (spec["shape"], spec["dtype"]):
            raise ReplayError(f"replay segments of {name!r} are {spec['dtype']} {spec['shape']}, the buffer's field "
                              f"is {None if array is None else (str(array.dtype), list(array.shape))}")
        for k, n, _ in spec["segments"]:
            lo, file = k * spec["segment"], directory / f"{name}.{k:05d}.bin"
            if file.stat().st_size != array[:, lo : lo + n].nbytes:
                raise ReplayError(f"replay segment {file} has {file.stat().st_size} bytes, its index says "
                                  f"{array[:, lo : lo + n].nbytes}")
            with open(file, "rb") as f:
                for stream in array:
                    _read_into(f, stream[lo : lo + n], file)
    return Lineage.after_load(index)


def _read_into(f: Any, target: np.ndarray, file: Path) -> None:
    view, done = target.data.cast("B"), 0  # ndarray.data: the memoryview of its buffer
    while done < view.nbytes:  # one read returns at most ~2 GiB
        got = f.readinto(view[done:])
        if not got:
            raise ReplayError(f"replay segment {file} is shorter than the entries its index lists")
        done += got
