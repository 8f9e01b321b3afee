"""``[B, T_cap]`` ring of per-environment time streams on a :class:`~tdrl.replay.storage.MemmapStore`.

This is rlpyt's replay layout with TorchRL's time-last convention: every stored key is a memmapped tensor of shape
``[B, T_cap, *per_step]``; a collector batch ``[B, T]`` is written at one universal time cursor shared by all ``B``
streams (``T_cap = capacity // B``), wrapping at the end. Time order inside each stream is what n-step windows,
frame stacks and sequences need. A flat ``[N]`` batch is one stream of ``N`` steps (``B = 1``).

Absolute time: step ``a`` (0, 1, 2, ... counted since the buffer was created) of every stream lives in slot
``a % T_cap``; a sample is identified by ``(b, a)`` and its flat index ``b * T_cap + a % T_cap`` (the ``index``
returned to users, also the prioritized sampler's leaf). The counters ``write_started``/``write_done`` are absolute
times, which is how readers detect a slot overwritten during a gather (see :mod:`tdrl.replay.storage`).

Why not TorchRL's ``LazyMemmapStorage`` + ``RoundRobinWriter`` here: they cost ~110 us per ``extend`` and ~135 us per
``sample`` on this machine (generic index conversion, ``MemoryMappedTensor`` dispatch), against ~3 us per field for a
direct slice copy / ``index_select`` on a plain tensor view of the memmap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.schema import BatchSchema, ReplayError, key_name
from tdrl.replay.storage import MemmapStore

__all__ = ["StreamRing", "nest"]


def nest(flat: dict[tuple[str, ...], torch.Tensor], batch_size: Sequence[int]) -> TensorDict:
    """Build a TensorDict from ``{nested key: tensor}`` whose shapes the caller guarantees.

    Uses ``TensorDict._new_unsafe`` (skips per-value validation; ~10x cheaper than the checked constructor, which
    was the largest single cost of a replay sample here), falling back to the public constructor if a tensordict
    release drops it.
    """
    size = torch.Size(batch_size)
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return _build(tree, size)


def _build(tree: dict[str, Any], size: torch.Size) -> TensorDict:
    items = {k: _build(v, size) if isinstance(v, dict) else v for k, v in tree.items()}
    new_unsafe = getattr(TensorDict, "_new_unsafe", None)
    if new_unsafe is None:
        return TensorDict(items, batch_size=size)
    return new_unsafe(items, batch_size=size)


class StreamRing:
    """Memmapped ``[B, T_cap]`` ring with schema checks and absolute-time bookkeeping.

    Args:
        directory: explicit storage directory (normally under the run directory).
        capacity: total transitions; ``T_cap = capacity // B`` rounded down to a multiple of ``time_multiple``.
        keys: store only these keys (others in a batch are ignored); default all tensor leaves of the first batch.
        exclude_keys: keys never stored by the schema (codecs such as frame stacks store them their own way).
        time_multiple: ``T_cap`` is made a multiple of this (sequence buffers: the state interval).
    """

    def __init__(self, directory: str | os.PathLike, capacity: int, *, keys: Sequence[NestedKey] | None = None,
                 exclude_keys: Sequence[NestedKey] = (), time_multiple: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.store = MemmapStore(directory)
        self.capacity_requested = int(capacity)
        self.keys = keys
        self.exclude_keys = tuple(exclude_keys)
        self.time_multiple = int(time_multiple)
        self.schema: BatchSchema | None = None
        self.num_streams = 0
        self.time_capacity = 0
        self.flat_batches = False
        self.fields: dict[tuple[str, ...], torch.Tensor] = {}
        self.flat: dict[tuple[str, ...], torch.Tensor] = {}
        self.groups: dict[str, list] = {}
        self.group_flat: dict[str, torch.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["fields"], state["flat"], state["groups"], state["group_flat"] = {}, {}, {}, {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.store.allocated:
            self._bind_fields()

    # ------------------------------------------------------------------------------------------------ layout
    @property
    def allocated(self) -> bool:
        if not self.store.allocated and self.store.ensure_open():
            self._adopt_meta()
        return self.store.allocated

    @property
    def capacity(self) -> int:
        """Transitions the ring holds when full (``B * T_cap``)."""
        return self.num_streams * self.time_capacity

    def allocate(self, batch: TensorDictBase, extra_fields: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 extra_meta: dict[str, Any]) -> None:
        """Fix ``B``, ``T_cap`` and the schema from the first batch and create the files."""
        if batch.batch_dims not in (1, 2):
            raise ReplayError(f"batch_size must be [B, T] (collector batch) or [N] (flat transitions), got "
                              f"{list(batch.batch_size)}")
        flat = batch.batch_dims == 1
        num_streams = 1 if flat else int(batch.batch_size[0])
        time_capacity = self.capacity_requested // num_streams // self.time_multiple * self.time_multiple
        if time_capacity < 1:
            raise ReplayError(f"capacity={self.capacity_requested} is too small for B={num_streams} streams "
                              f"(needs at least {num_streams * self.time_multiple})")
        schema = BatchSchema.from_batch(batch, batch.batch_dims, self.keys, self.exclude_keys)
        # keys packed into one [B, T_cap, width] array per (root | next, dtype): a sample then needs one gather per
        # group instead of one per key, and reads each transition's row from neighbouring cache lines
        packing: dict[str, list] = {}
        widths: dict[str, tuple[int, torch.dtype]] = {}
        for key, (dtype, shape) in schema.entries.items():
            group = f"{'next' if key[0] == 'next' else 'root'}.{str(dtype).removeprefix('torch.')}"
            width = widths.get(group, (0, dtype))[0]
            size = int(torch.Size(shape).numel())
            packing[key_name(key)] = [group, width, size]
            widths[group] = (width + size, dtype)
        fields = {group: ((num_streams, time_capacity, width), dtype) for group, (width, dtype) in widths.items()}
        overlap = set(fields) & set(extra_fields)
        if overlap:
            raise ReplayError(f"field name clash in replay storage: {sorted(overlap)}")
        fields.update(extra_fields)
        meta = {"num_streams": num_streams, "time_capacity": time_capacity, "flat_batches": flat,
                "schema": schema.to_json(), "packing": packing, **extra_meta}
        self.store.allocate(fields, meta)
        self._adopt_meta()

    def _adopt_meta(self) -> None:
        meta = self.store.meta
        self.num_streams = meta["num_streams"]
        self.time_capacity = meta["time_capacity"]
        self.flat_batches = meta["flat_batches"]
        self.schema = BatchSchema.from_json(meta["schema"])
        self._bind_fields()

    def _bind_fields(self) -> None:
        packing = self.store.meta["packing"]
        rows = self.num_streams * self.time_capacity
        self.fields, self.flat, self.groups = {}, {}, {}
        for key, (_, shape) in self.schema.entries.items():
            group, offset, size = packing[key_name(key)]
            whole = self.store.fields[group]
            self.fields[key] = whole[..., offset : offset + size].view(*whole.shape[:2], *shape)
            self.flat[key] = self.fields[key].view(rows, *shape)
            self.groups.setdefault(group, []).append((key, offset, size, shape))
        self.group_flat = {g: self.store.fields[g].view(rows, -1) for g in self.groups}

    def field(self, name: str) -> torch.Tensor:
        """An extra (codec-owned) field by name."""
        return self.store.fields[name]

    # ------------------------------------------------------------------------------------------------- writes
    def check(self, batch: TensorDictBase) -> tuple[dict[tuple[str, ...], torch.Tensor], int]:
        """Validate a batch against the layout; returns its stored tensors as ``[B, T, ...]`` and ``T``."""
        if not isinstance(batch, TensorDictBase):
            raise ReplayError(f"extend() takes a TensorDict, got {type(batch).__name__}")
        if batch.batch_dims == 1:
            if not self.flat_batches:
                raise ReplayError(f"batch_size {list(batch.batch_size)} is a flat [N] batch, but this buffer "
                                  f"stores B={self.num_streams} time streams; extend it with [B, T] batches")
            steps = int(batch.batch_size[0])
        elif batch.batch_dims == 2:
            if self.flat_batches or batch.batch_size[0] != self.num_streams:
                expected = "[N] (flat)" if self.flat_batches else f"[{self.num_streams}, T]"
                raise ReplayError(f"batch_size {list(batch.batch_size)} does not match the buffer's {expected}")
            steps = int(batch.batch_size[1])
        else:
            raise ReplayError(f"batch_size must be [B, T] or [N], got {list(batch.batch_size)}")
        if steps > self.time_capacity:
            raise ReplayError(f"batch has {steps} time steps, more than the buffer's T_cap={self.time_capacity} "
                              f"(capacity {self.capacity} / B={self.num_streams})")
        columns = self.schema.check(batch, batch.batch_size)
        if self.flat_batches:
            columns = {k: v.unsqueeze(0) for k, v in columns.items()}
        return columns, steps

    def write(self, target: torch.Tensor, value: torch.Tensor, start: int, time_stride: int = 1) -> None:
        """Copy ``value [B, T, ...]`` into ``target [B, T_cap/time_stride, ...]`` at absolute time ``start``."""
        size = target.shape[1]
        slot = (start // time_stride) % size
        steps = value.shape[1]
        first = min(steps, size - slot)
        target[:, slot : slot + first].copy_(value[:, :first])
        if first < steps:
            target[:, : steps - first].copy_(value[:, first:])

    def write_columns(self, columns: dict[tuple[str, ...], torch.Tensor], start: int) -> None:
        """Write every schema key of a checked batch: one ``torch.cat(..., out=)`` per packed group straight into the
        ring (half the cost of a strided ``copy_`` per key; this is the extend hot path)."""
        steps = next(iter(columns.values())).shape[1]
        slot = start % self.time_capacity
        first = min(steps, self.time_capacity - slot)
        lead = (self.num_streams, steps)
        for group, members in self.groups.items():
            parts = [columns[key].reshape(*lead, size) for key, _, size, _ in members]
            target = self.store.fields[group]
            if first == steps:
                torch.cat(parts, dim=-1, out=target.narrow(1, slot, steps))
            else:
                torch.cat([p.narrow(1, 0, first) for p in parts], dim=-1, out=target.narrow(1, slot, first))
                torch.cat([p.narrow(1, first, steps - first) for p in parts], dim=-1,
                          out=target.narrow(1, 0, steps - first))

    # ----------------------------------------------------------------------------------------- time bookkeeping
    @property
    def write_done(self) -> int:
        return self.store.counter("write_done")

    @property
    def write_started(self) -> int:
        return self.store.counter("write_started")

    def oldest(self, done: int) -> int:
        """Absolute time of the oldest step still stored when ``done`` steps are complete."""
        return max(0, done - self.time_capacity)

    def flat_index(self, stream: np.ndarray, time: np.ndarray) -> np.ndarray:
        """Flat index ``b * T_cap + a % T_cap`` of absolute step ``a`` in stream ``b``."""
        return stream * self.time_capacity + time % self.time_capacity

    def absolute_time(self, flat_index: np.ndarray, done: int) -> tuple[np.ndarray, np.ndarray]:
        """``(stream, absolute time)`` of flat indices, for the data complete at ``done``."""
        stream, slot = np.divmod(flat_index, self.time_capacity)
        newest = done - 1
        return stream, newest - (newest - slot) % self.time_capacity

    def columns_of(self, start: int, stop: int) -> np.ndarray:
        """Flat indices of absolute steps ``[start, stop)`` in every stream."""
        times = np.arange(max(start, 0), max(stop, 0), dtype=np.int64)
        streams = np.arange(self.num_streams, dtype=np.int64)
        return self.flat_index(streams[:, None], times[None, :]).reshape(-1)

    def gather(self, key: tuple[str, ...], index: torch.Tensor) -> torch.Tensor:
        """One key at flat ``index`` (a strided gather; prefer :meth:`gather_keys` for many keys)."""
        return torch.index_select(self.flat[key], 0, index)

    def gather_keys(self, index: torch.Tensor, part: str | None = None) -> dict[tuple[str, ...], torch.Tensor]:
        """Every stored key (or only ``part``: ``"root"`` or ``"next"`` keys) at flat ``index`` ``[N]``: one
        ``index_select`` per packed group, then per-key views ``[N, *shape]`` of it."""
        out = {}
        n = index.shape[0]
        for group, members in self.groups.items():
            if part is not None and not group.startswith(part + "."):
                continue
            rows = torch.index_select(self.group_flat[group], 0, index)
            for key, offset, size, shape in members:
                out[key] = rows[:, offset : offset + size].view(n, *shape)
        return out
