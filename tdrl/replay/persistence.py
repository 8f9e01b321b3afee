"""A :class:`~tdrl.replay.ring.StreamRing` in a checkpoint: its state (counters, layout, the uniform RNG, the
prioritized sampler) and its dump, a directory holding that state as ``replay_state.pt`` and the filled part of the
data as ``segments/`` (:mod:`tdrl.replay.segments`: a segment unchanged since the previous dump is hard-linked
from it). The buffers reach these through the ring's ``state_dict``, ``load_state_dict``, ``dump`` and ``load``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tdrl.replay.schema import BatchSchema, ReplayError, pack
from tdrl.replay.segments import Lineage, read_segments, write_segments

if TYPE_CHECKING:
    from tdrl.replay.ring import StreamRing

__all__ = ["dump_ring", "load_ring", "restore_ring", "ring_state"]

SEGMENTS, STATE_FILE = "segments", "replay_state.pt"  # a dump's data and state


def ring_state(ring: StreamRing) -> dict[str, Any]:
    """Counters and layout, the uniform RNG and the sampler (the data stays in the files)."""
    state = {"ring": ring.store.state_dict(), "rng": ring.rng.bit_generator.state}
    if ring.sampler is not None:
        state["sampler"] = ring.sampler.state_dict()
    return state


def restore_ring(ring: StreamRing, state: dict[str, Any], keep_data: bool) -> None:
    """Reopen the files with the layout and counters of :func:`ring_state` (in place with ``keep_data``, else
    created empty for the data a dump's segments fill), then restore the RNG and the sampler."""
    saved = state["ring"]["meta"] or ring.layout
    if {key: saved.get(key) for key in ring.layout} != ring.layout:
        raise ReplayError(f"state is of a buffer with {saved}, this buffer has {ring.layout}")
    if saved is not ring.layout and "cursors" not in saved:  # saved before segments: the ring's own fields
        groups = pack(BatchSchema.from_json(saved["schema"]))
        state = {**state, "ring": {**state["ring"], "meta": {**saved, "cursors": dict.fromkeys(groups, 1)}}}
    ring.store.restore(state["ring"], keep_data=keep_data)
    ring.lineage = Lineage()  # data of unknown history: share no checkpoint segments until one is loaded
    ring.synced = False
    if ring.store.meta is not None:
        ring.adopt_meta()
        if ring.sampler is not None:
            ring.sampler.bind(ring.num_leaves, ring.store.directory)
    if ring.sampler is not None and "sampler" in state:
        ring.sampler.load_state_dict(state["sampler"])
    ring.rng.bit_generator.state = state["rng"]


def dump_ring(ring: StreamRing, path: str | os.PathLike, previous: str | os.PathLike | None = None) -> None:
    """Save :func:`ring_state` to ``path`` with the filled part of the data as ``segments/`` (unless ``path`` holds
    the data files), hard-linking the segments unchanged since the dump in ``previous`` (an earlier ``path``, e.g. in
    the previous checkpoint; read only): see :mod:`tdrl.replay.segments`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if ring.allocated and path.resolve() != ring.store.directory.resolve():
        if previous is not None and Path(previous).resolve() == path.resolve():
            raise ValueError(f"dump {path}: previous must be another dump, not the one being replaced")
        shutil.rmtree(path / SEGMENTS, ignore_errors=True)  # names only: other dumps keep files they link
        linked = Path(previous) / SEGMENTS if previous is not None else None
        write_segments(ring.store, path / SEGMENTS, linked, ring.lineage, ring.segment_bytes)
    elif ring.allocated:
        ring.store.flush()
    torch.save(ring_state(ring), path / STATE_FILE)


def load_ring(ring: StreamRing, path: str | os.PathLike) -> None:
    """Restore what :func:`dump_ring` wrote: the state, then the data (also the whole field files of ``storage/``
    that dumps held before segments)."""
    path = Path(path)
    segments = path / SEGMENTS
    restore_ring(ring, torch.load(path / STATE_FILE, weights_only=False), keep_data=not segments.is_dir())
    if ring.store.allocated and segments.is_dir():
        ring.lineage = read_segments(ring.store, segments)
    elif ring.store.allocated and (path / "storage").exists():
        ring.store.copy_files_from(path / "storage")
