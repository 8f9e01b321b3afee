"""``[B, T_cap]`` ring of per-environment time streams on a :class:`~tdrl.replay.storage.MemmapStore`.

rlpyt's replay layout with TorchRL's time-last convention: every stored key is a memmapped ``[B, T_cap, *per_step]``
tensor and a ``[B, T]`` batch is written at one time cursor shared by all streams, wrapping at the end, so n-step
windows, frame stacks and sequences read consecutive steps. A flat ``[N]`` batch is one stream of ``N`` steps.

Step ``a`` (absolute, counted since creation) of stream ``b`` lives at flat index ``b * T_cap + a % T_cap`` (the
``index`` users get back, and the prioritized sampler's leaf). ``write_started``/``write_done`` are absolute times,
which is how readers detect a slot overwritten during a gather (:func:`gather_consistent`).

The ring also holds what both buffers need around the data: lazy adoption of a layout another process allocated,
input priorities, the uniform and prioritized draws, the seqlock gather and the buffer state for checkpoints.

Not TorchRL's ``LazyMemmapStorage``: its generic index conversion and ``MemoryMappedTensor`` dispatch make every
extend and sample an order of magnitude slower than a slice copy / ``index_select`` on a plain tensor view.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.prioritized import PrioritizedSampler, check_priorities
from tdrl.replay.schema import BatchSchema, ReplayError, key_name
from tdrl.replay.storage import MemmapStore

__all__ = ["StreamRing", "gather_consistent", "nest"]

_MAX_REDRAWS = 64


def nest(flat: dict[tuple[str, ...], torch.Tensor], batch_size: Sequence[int]) -> TensorDict:
    """Build a TensorDict from ``{nested key: tensor}``."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    return TensorDict(tree, batch_size=batch_size)


def gather_consistent(ring: StreamRing, n: int, draw: Callable, gather: Callable, oldest_read: Callable) -> tuple:
    """Draw and gather ``n`` samples that no concurrent write overwrote (the reader side of the seqlock).

    ``draw(n) -> (stream, position, values)`` draws from the data complete now, ``gather(stream, position)`` copies
    the rows out, and ``oldest_read(position)`` is the oldest absolute time a row reads. Rows whose oldest slot a
    later write started overwriting during the gather are drawn again; rows that passed are final.
    Returns ``(stream, position, values, gathered)``.
    """
    stream, position, values = draw(n)
    out = gather(stream, position)
    rows = np.arange(n)
    for _ in range(_MAX_REDRAWS):
        stale = oldest_read(position[rows]) < ring.write_started - ring.time_capacity
        if not stale.any():
            return stream, position, values, out
        rows = rows[stale]
        stream[rows], position[rows], new_values = draw(rows.size)
        if values is not None:
            values[rows] = new_values
        out[torch.from_numpy(rows)] = gather(stream[rows], position[rows])
    raise ReplayError("sampling kept colliding with concurrent writes; the writer is lapping the buffer")


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
        self.synced = False
        self.mask_key: tuple[str, ...] | None = None  # the validity mask, when the buffer stores one
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
        # keys packed into one [B, T_cap, width] array per (root | next, dtype): one gather per group, not per key
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

    def dump(self, path: str | os.PathLike, state: dict[str, Any]) -> None:
        """Save a buffer's ``state`` to ``path`` with a copy of the data files (unless ``path`` holds them)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.allocated and path.resolve() != self.store.directory.resolve():
            self.store.copy_files_to(path / "storage")
        elif self.allocated:
            self.store.flush()
        torch.save(state, path / "replay_state.pt")

    def load(self, path: str | os.PathLike, load_state_dict: Callable[[dict[str, Any]], None]) -> None:
        """Restore what :meth:`dump` wrote: the buffer's state through ``load_state_dict``, then the data."""
        path = Path(path)
        load_state_dict(torch.load(path / "replay_state.pt", weights_only=False))
        if self.store.allocated and (path / "storage").exists():
            self.store.copy_files_from(path / "storage")

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

    @property
    def num_leaves(self) -> int:
        """Prioritized-sampler leaves: one per ``time_multiple`` steps (a sequence buffer's stored-state starts)."""
        return self.capacity // self.time_multiple

    def ready(self, sampler: PrioritizedSampler | None, mask_key: tuple[str, ...] | None) -> bool:
        """Whether storage exists. Adopts, once, a layout another process allocated (a buffer shared before its
        first extend learns B, the schema and the sampler files lazily) and whether ``mask_key`` is stored."""
        if self.allocated and not self.synced:
            self.mask_key = mask_key if mask_key is not None and mask_key in self.schema.entries else None
            if sampler is not None and sampler.capacity != self.num_leaves:
                sampler.attach(self.num_leaves, self.store.directory)
            self.synced = True
        return self.allocated

    def valid_at(self, stream: np.ndarray, time: np.ndarray) -> np.ndarray | None:
        """The validity mask at absolute steps ``(stream, time)``, flattened; None when none is stored."""
        if self.mask_key is None:
            return None
        index = torch.from_numpy(np.asarray(self.flat_index(stream, time)).reshape(-1))
        return self.flat[self.mask_key][index].reshape(-1).numpy()

    def draw_uniform(self, rng: np.random.Generator, n: int, lo: int, hi: int, stride: int = 1) -> tuple:
        """``(stream, position)`` of ``n`` uniform draws of positions ``lo..hi`` (absolute time / ``stride``) in every
        stream, redrawing those whose step the validity mask marks invalid."""
        per_stream = hi - lo + 1
        if per_stream < 1:
            raise ReplayError("nothing is ready to sample")
        total = per_stream * self.num_streams
        stream, position = np.divmod(rng.integers(0, total, n), per_stream)
        position += lo
        for _ in range(_MAX_REDRAWS):
            valid = self.valid_at(stream, position * stride)
            if valid is None or valid.all():
                return stream, position
            bad = ~valid
            stream[bad], position[bad] = np.divmod(rng.integers(0, total, bad.sum()), per_stream)
            position[bad] += lo
        raise ReplayError(f"almost no valid steps: {key_name(self.mask_key)!r} is False nearly everywhere")

    def draw_leaves(self, sampler: PrioritizedSampler, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``(leaves, leaf values, write_done)``: ``n`` prioritized draws and the data they were drawn from."""
        with self.store.lock():
            return *sampler.draw_leaves(n), self.write_done

    def buffer_state(self, rng: np.random.Generator, sampler: PrioritizedSampler | None) -> dict[str, Any]:
        """A buffer's state: counters and layout, its RNG and its sampler (the data stays in the files)."""
        state = {"ring": self.store.state_dict(), "rng": rng.bit_generator.state}
        if sampler is not None:
            state["sampler"] = sampler.state_dict()
        return state

    def load_buffer_state(self, state: dict, rng: np.random.Generator, sampler: PrioritizedSampler | None) -> None:
        """Reopen the files in place with the layout and counters of :meth:`buffer_state`, then restore the rest."""
        self.store.restore(state["ring"])
        self.synced = False
        if self.store.meta is not None:
            self._adopt_meta()
            if sampler is not None:
                sampler.bind(self.num_leaves, self.store.directory)
        if sampler is not None and "sampler" in state:
            sampler.load_state_dict(state["sampler"])
        rng.bit_generator.state = state["rng"]

    @property
    def write_count(self) -> int:
        """Steps written by any process, over all streams."""
        return self.write_done * self.num_streams if self.allocated else 0

    @property
    def stored(self) -> int:
        """Steps currently held, over all streams."""
        return min(self.write_done, self.time_capacity) * self.num_streams if self.allocated else 0

    def step_priorities(self, batch: TensorDictBase, key: tuple[str, ...], steps: int) -> np.ndarray | None:
        """The batch's per-step input priorities under ``key`` as ``[B, T]`` float64, or None when absent."""
        value = batch.get(key, None)
        if value is None:
            return None
        expected = (self.num_streams, steps)
        if self.flat_batches and value.numel() == steps:
            value = value.reshape(1, -1)
        if value.shape[:2] != expected or value.numel() != steps * self.num_streams:
            raise ReplayError(f"key {key_name(key)!r} has shape {tuple(value.shape)}, expected "
                              f"{list(batch.batch_size)} (one priority per step)")
        return check_priorities(value, key_name(key)).reshape(expected)

    def field(self, name: str) -> torch.Tensor:
        """An extra (codec-owned) field by name."""
        return self.store.fields[name]

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
        """Write every schema key of a checked batch: one ``torch.cat(..., out=)`` per packed group into the ring."""
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

    @property
    def write_done(self) -> int:
        return self.store.counter("write_done")

    @property
    def write_started(self) -> int:
        return self.store.counter("write_started")

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
