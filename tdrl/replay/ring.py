"""``[B, T_cap]`` ring of per-environment time streams on a :class:`~tdrl.replay.storage.MemmapStore`, and the
sampling index both buffers share.

rlpyt's layout, time last: every stored key is a memmapped ``[B, T_cap, *per_step]`` view and a ``[B, T]`` batch is
written at one time cursor shared by all streams, wrapping at the end, so n-step windows, frame stacks and sequences
read consecutive steps (a flat ``[N]`` batch is one stream). Step ``a`` (absolute, counted since creation) of stream
``b`` lives at flat index ``b * T_cap + a % T_cap``.

Samples start at *slots*, every ``stride``-th step (1 for transitions, the stored-state interval for sequences).
Slot ``s`` of stream ``b`` is leaf ``b * (T_cap // stride) + s % (T_cap // stride)``: the ``index`` a sample carries
and the prioritized sampler's leaf. A slot is sampleable once the ``lookahead`` steps after it are written, while
the ``lookback`` steps before it are not overwritten, and where the validity mask is True. Its checkpoint state and
dump are :mod:`tdrl.replay.persistence`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.device import staged, views
from tdrl.replay.persistence import dump_ring, load_ring, restore_ring, ring_state
from tdrl.replay.prioritized import PrioritizedSampler, check_priorities
from tdrl.replay.schema import BatchSchema, ReplayError, as_key, key_name, pack
from tdrl.replay.segments import SEGMENT_BYTES, Lineage
from tdrl.replay.storage import MemmapStore
from tdrl.utils.seeding import numpy_generator

__all__ = ["StreamRing"]

_MAX_REDRAWS = 64
PRIORITY_KEY = ("priority",)  # per-step input priorities of a batch, for a prioritized sampler's new slots


class StreamRing:
    """Memmapped ``[B, T_cap]`` ring with schema checks, absolute-time bookkeeping and the slot index.

    Args:
        directory: explicit storage directory (normally under the run directory).
        capacity: total steps; ``T_cap = capacity // B`` rounded down to a multiple of ``stride``.
        keys: store only these keys (others in a batch are ignored); default all tensor leaves of the first batch.
        layout: what the buffer's samples depend on (``kind``, ``n_step``, ...), saved and checked on load.
        exclude_keys: keys never stored by the schema (codecs such as frame stacks store them their own way).
        stride, lookback, lookahead: slot spacing, and the steps before / after a slot that its sample reads.
        sampler: ``None`` for uniform draws, or a :class:`PrioritizedSampler` with one leaf per slot.
        mask_key: per-step validity mask (wait-reset collectors); slots where it is False are never drawn.
        seed: of the uniform draws; ``None``: drawn from torch's global generator (``torch.manual_seed`` fixes it).
    """

    def __init__(self, directory: str | os.PathLike, capacity: int, layout: dict[str, Any], *,
                 keys: Sequence[NestedKey] | None = None, exclude_keys: Sequence[NestedKey] = (), stride: int = 1,
                 lookback: int = 0, lookahead: int = 0, sampler: PrioritizedSampler | None = None,
                 mask_key: NestedKey | None = None, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.store = MemmapStore(directory)
        self.capacity_requested = int(capacity)
        self.layout = layout
        self.keys = keys
        self.exclude_keys = (PRIORITY_KEY, *exclude_keys)
        self.stride, self.lookback, self.lookahead = int(stride), int(lookback), int(lookahead)
        self.sampler = sampler
        self.mask_key = as_key(mask_key) if mask_key is not None else None
        self.rng = numpy_generator(seed)
        self.schema: BatchSchema | None = None
        self.num_streams = self.time_capacity = 0
        self.flat_batches = self.synced = False
        self.stored_mask_key: tuple[str, ...] | None = None  # mask_key, when the batches carry it
        self.groups: dict[str, list] = {}  # packed group -> [(key, offset, size, shape)]
        self.fields: dict[tuple[str, ...], torch.Tensor] = {}  # key -> [B, T_cap, *shape] view of its group
        self.flat: dict[Any, torch.Tensor] = {}  # key or group -> [B * T_cap, ...] view, for gathers by flat index
        self.lineage = Lineage()  # which checkpoint segments this data still matches (dump links them)
        self.segment_bytes = SEGMENT_BYTES  # size of one checkpoint segment file

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "fields": {}, "flat": {}, "synced": False}  # views are rebuilt by _sync()

    @property
    def allocated(self) -> bool:
        """Whether storage exists (here, or allocated since by another process: see :meth:`_sync`)."""
        if not self.synced and self.store.ensure_open():
            self._sync()
        return self.store.allocated

    def _sync(self) -> None:
        """Adopt the layout in ``meta.json`` (a buffer shared before its first extend learns B, the schema and the
        sampler files lazily), and whether the batches carry the validity mask."""
        self.adopt_meta()
        assert self.schema is not None  # adopted from meta.json
        self.stored_mask_key = self.mask_key if self.mask_key in self.schema.entries else None
        if self.sampler is not None and self.sampler.capacity != self.num_leaves:
            self.sampler.bind(self.num_leaves, self.store.directory, create=False)
        self.synced = True

    @property
    def capacity(self) -> int:
        """Steps the ring holds when full (``B * T_cap``)."""
        return self.num_streams * self.time_capacity

    def allocate(self, batch: TensorDictBase, extra_fields: Callable[[int, int], dict] | None = None) -> None:
        """Fix ``B``, ``T_cap`` and the schema from the first batch and create the files (with codec-owned fields
        ``extra_fields(B, T_cap)``: name -> (shape, dtype, cursor), the cursor as in
        :func:`~tdrl.replay.segments.field_cursors`), and the sampler's tree."""
        if batch.batch_dims not in (1, 2):
            raise ReplayError(f"batch_size must be [B, T] (collector batch) or [N] (flat transitions), got "
                              f"{list(batch.batch_size)}")
        flat = batch.batch_dims == 1
        num_streams = 1 if flat else int(batch.batch_size[0])
        time_capacity = self.capacity_requested // num_streams // self.stride * self.stride
        if time_capacity < 1:
            raise ReplayError(f"capacity={self.capacity_requested} is too small for B={num_streams} streams "
                              f"(needs at least {num_streams * self.stride})")
        schema = BatchSchema.from_batch(batch, batch.batch_dims, self.keys, self.exclude_keys)
        fields = {}
        for group, members in pack(schema).items():
            width, dtype = members[-1][1] + members[-1][2], schema.entries[members[0][0]][0]
            fields[group] = ((num_streams, time_capacity, width), dtype)
        extra = extra_fields(num_streams, time_capacity) if extra_fields is not None else {}
        if set(fields) & set(extra):
            raise ReplayError(f"field name clash in replay storage: {sorted(set(fields) & set(extra))}")
        cursors = {**dict.fromkeys(fields, 1), **{name: spec[2] for name, spec in extra.items() if spec[2] is not None}}
        meta = {"num_streams": num_streams, "time_capacity": time_capacity, "flat_batches": flat,
                "schema": schema.to_json(), "cursors": cursors, **self.layout}
        self.store.allocate({**fields, **{name: spec[:2] for name, spec in extra.items()}}, meta)
        if self.sampler is not None:
            self.sampler.bind(num_streams * (time_capacity // self.stride), self.store.directory)
        self._sync()

    def adopt_meta(self) -> None:
        """Layout and per-key views of the fields ``meta.json`` describes."""
        meta = self.store.meta
        assert meta is not None  # called once the store is allocated
        self.num_streams, self.time_capacity = meta["num_streams"], meta["time_capacity"]
        self.flat_batches = meta["flat_batches"]
        self.schema = BatchSchema.from_json(meta["schema"])
        self.groups = pack(self.schema)
        self.fields, self.flat = views(self.groups, self.store.fields)

    def field(self, name: str) -> torch.Tensor:
        """An extra (codec-owned) field by name."""
        return self.store.fields[name]

    @property
    def write_done(self) -> int:
        return self.store.counter("write_done")

    @property
    def write_started(self) -> int:
        return self.store.counter("write_started")

    @property
    def write_count(self) -> int:
        """Steps written by any process, over all streams."""
        return self.write_done * self.num_streams if self.allocated else 0

    @property
    def stored(self) -> int:
        """Steps currently held, over all streams."""
        return min(self.write_done, self.time_capacity) * self.num_streams if self.allocated else 0

    @property
    def slots_per_stream(self) -> int:
        return self.time_capacity // self.stride

    @property
    def num_leaves(self) -> int:
        return self.num_streams * self.slots_per_stream

    def leaf(self, stream: np.ndarray, slot: np.ndarray) -> np.ndarray:
        """Leaf of absolute slot ``slot`` in stream ``stream``."""
        return stream * self.slots_per_stream + slot % self.slots_per_stream

    def leaves_of(self, lo: int, hi: int) -> np.ndarray:
        """Leaves of absolute slots ``[lo, hi)`` in every stream."""
        slots = np.arange(max(lo, 0), max(hi, 0), dtype=np.int64)
        return self.leaf(np.arange(self.num_streams, dtype=np.int64)[:, None], slots[None, :]).reshape(-1)

    def flat_index(self, stream: np.ndarray, time: np.ndarray) -> np.ndarray:
        """Flat index ``b * T_cap + a % T_cap`` of absolute step ``a`` in stream ``b``."""
        return stream * self.time_capacity + time % self.time_capacity

    def slot_range(self, done: int) -> tuple[int, int]:
        """``[lo, hi]`` slots sampleable once ``done`` steps are complete (none when ``hi < lo``)."""
        oldest = done - self.time_capacity + self.lookback if done > self.time_capacity else 0
        return -(-oldest // self.stride), (done - 1 - self.lookahead) // self.stride

    def ready_count(self) -> int:
        """Sampleable slots over all streams (ignoring the validity mask)."""
        if not self.allocated:
            return 0
        lo, hi = self.slot_range(self.write_done)
        return max(0, hi - lo + 1) * self.num_streams

    def valid_at(self, stream: np.ndarray, time: np.ndarray) -> np.ndarray | None:
        """The validity mask at absolute steps ``(stream, time)``, flattened; None when none is stored."""
        if self.stored_mask_key is None:
            return None
        index = torch.from_numpy(np.asarray(self.flat_index(stream, time)).reshape(-1))
        return self.flat[self.stored_mask_key][index].reshape(-1).numpy()

    def check(self, batch: TensorDictBase) -> tuple[dict[tuple[str, ...], torch.Tensor], int, np.ndarray | None]:
        """Validate a batch against the layout before anything is written.

        Returns its stored tensors as ``[B, T, ...]``, ``T``, and (prioritized) its per-step input priorities
        ``[B, T]`` float64 or None.
        """
        if not isinstance(batch, TensorDictBase):
            raise ReplayError(f"extend() takes a TensorDict, got {type(batch).__name__}")
        leading = [] if self.flat_batches else [self.num_streams]  # batch dims before time
        if batch.batch_dims == 0 or list(batch.batch_size[:-1]) != leading:
            expected = "[N] (flat transitions)" if self.flat_batches else f"[{self.num_streams}, T] ([B, T] batches)"
            raise ReplayError(f"batch_size {list(batch.batch_size)} does not match the buffer's {expected}")
        steps = int(batch.batch_size[-1])
        if steps > self.time_capacity:
            raise ReplayError(f"batch has {steps} time steps, more than the buffer's T_cap={self.time_capacity} "
                              f"(capacity {self.capacity} / B={self.num_streams})")
        assert self.schema is not None  # the buffers allocate the ring before they check a batch
        columns = self.schema.check(batch, batch.batch_size)
        if self.flat_batches:
            columns = {k: v.unsqueeze(0) for k, v in columns.items()}
        priority = batch.get(PRIORITY_KEY, None) if self.sampler is not None else None
        if priority is not None:
            name = key_name(PRIORITY_KEY)
            if priority.numel() != steps * self.num_streams or priority.shape[: batch.batch_dims] != batch.batch_size:
                raise ReplayError(f"key {name!r} has shape {tuple(priority.shape)}, expected "
                                  f"{list(batch.batch_size)} (one priority per step)")
            priority = check_priorities(priority, name).reshape(self.num_streams, steps)
        return columns, steps, priority

    def begin_write(self, steps: int) -> int:
        """Publish a write of ``steps`` steps and make the slots it ends unsampleable; returns its first step."""
        start = self.store.begin_write(steps)
        if self.sampler is not None:
            lo_old, hi_old = self.slot_range(start)
            lo_new, _ = self.slot_range(start + steps)
            with self.store.lock():
                self.sampler.invalidate(self.leaves_of(lo_old, min(lo_new, hi_old + 1)))
        return start

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

    def end_write(self, start: int, steps: int, priority: np.ndarray | None) -> None:
        """Publish the write as complete; give its slots their input (or default) priorities and make the slots
        whose samples it completed sampleable."""
        self.store.end_write()
        if self.sampler is None:
            return
        if priority is not None:
            priority = priority[:, (-start) % self.stride :: self.stride].reshape(-1)
        new = self.leaves_of(-(-start // self.stride), -(-(start + steps) // self.stride))
        lo, hi = self.slot_range(start + steps)
        lo = max(lo, self.slot_range(start)[1] + 1)
        slots = np.arange(lo, hi + 1)[None, :]
        valid = self.valid_at(np.arange(self.num_streams)[:, None], slots * self.stride)
        with self.store.lock():
            self.sampler.assign(new, priority)
            self.sampler.activate(self.leaves_of(lo, hi + 1), valid=valid)
            self.sampler.advance(steps * self.num_streams)

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(stream, absolute slot, leaf values or None)`` of ``n`` draws from the data complete now."""
        if self.sampler is not None:
            with self.store.lock():
                leaves, values = self.sampler.draw_leaves(n)
                done = self.write_done
            stream, slot = np.divmod(leaves, self.slots_per_stream)
            newest = self.slot_range(done)[1]
            return stream, newest - (newest - slot) % self.slots_per_stream, values
        started, done = self.write_started, self.write_done
        lo, hi = self.slot_range(started)[0], self.slot_range(done)[1]  # never slots a write in progress replaces
        per_stream = hi - lo + 1
        if per_stream < 1:
            raise ReplayError("nothing is ready to sample")
        total = per_stream * self.num_streams
        stream, slot = np.divmod(self.rng.integers(0, total, n), per_stream)
        slot += lo
        for _ in range(_MAX_REDRAWS):
            valid = self.valid_at(stream, slot * self.stride) if self.stored_mask_key is not None else None
            if valid is None or valid.all():
                return stream, slot, None
            bad = ~valid
            stream[bad], slot[bad] = np.divmod(self.rng.integers(0, total, bad.sum()), per_stream)
            slot[bad] += lo
        assert self.stored_mask_key is not None  # without a mask the first draw is valid
        raise ReplayError(f"almost no valid steps: {key_name(self.stored_mask_key)!r} is False nearly everywhere")

    def sample(self, n: int, gather: Callable[[np.ndarray, np.ndarray], TensorDictBase]) -> tuple:
        """Draw ``n`` slots and ``gather(stream, slot)`` their rows, none of which a concurrent write overwrote.

        The reader side of the seqlock (:mod:`tdrl.replay.storage`): rows whose oldest step a later write started
        overwriting during the gather are drawn again; rows that passed are final.
        Returns ``(leaves, gathered, importance weights or None)``.
        """
        stream, slot, values = self.draw(n)
        out = gather(stream, slot)
        rows = np.arange(n)
        for _ in range(_MAX_REDRAWS):
            stale = slot[rows] * self.stride - self.lookback < self.write_started - self.time_capacity
            if not stale.any():
                sampler = self.sampler  # leaf values come from it
                weights = None if values is None or sampler is None else sampler.importance_weights(values)
                return self.leaf(stream, slot), out, weights
            rows = rows[stale]
            stream[rows], slot[rows], new_values = self.draw(rows.size)
            if values is not None:
                values[rows] = new_values
            out[torch.from_numpy(rows)] = gather(stream[rows], slot[rows])
        raise ReplayError("sampling kept colliding with concurrent writes; the writer is lapping the buffer")

    def gather(self, key: tuple[str, ...], index: torch.Tensor, flat: Mapping | None = None) -> torch.Tensor:
        """One key at flat ``index`` (a strided gather; prefer :meth:`gather_keys` for many keys), from :attr:`flat`
        or the same views of a copy (``flat``, with ``index`` on its device)."""
        return torch.index_select((self.flat if flat is None else flat)[key], 0, index)

    def gather_keys(self, index: torch.Tensor, part: str | None = None, device: torch.device | None = None,
                    flat: Mapping | None = None) -> dict[tuple[str, ...], torch.Tensor]:
        """Every stored key (or only ``part``: ``"root"`` or ``"next"`` keys) at flat ``index`` ``[N]``: one
        ``index_select`` per packed group (into pinned memory and on to ``device`` in one copy when that is a GPU;
        on a copy's device with ``flat``), then per-key views ``[N, *shape]`` of it."""
        out = {}
        n = index.shape[0]
        pinned = flat is None and device is not None and device.type == "cuda"
        for group, members in self.groups.items():
            if part is not None and not group.startswith(part + "."):
                continue
            source = (self.flat if flat is None else flat)[group]
            rows = torch.empty((n, *source.shape[1:]), dtype=source.dtype, device=source.device, pin_memory=pinned)
            torch.index_select(source, 0, index, out=rows)
            if device is not None:
                rows = staged(rows, device)
            for key, offset, size, shape in members:
                out[key] = rows[:, offset : offset + size].view(n, *shape)
        return out

    def update_priority(self, index: Any, priority: Any = None, reduce: Callable | None = None) -> None:
        """New priorities for sampled leaves.

        Args:
            index: a sample's ``index`` (a sequence's is broadcast along time), or the sample itself (then
                ``priority`` defaults to its ``"td_error"``, as TorchRL losses write it).
            priority: one non-negative finite value per index, or what ``reduce`` turns into that.
        """
        if self.sampler is None:
            raise ReplayError("update_priority() needs a prioritized buffer (sampler=PrioritizedSampler(...))")
        if isinstance(index, TensorDictBase):
            index, priority = index.get("index"), index.get("td_error") if priority is None else priority
        index = torch.as_tensor(index)
        index = index[:, 0] if index.ndim == 2 else index
        priority = reduce(torch.as_tensor(priority)) if reduce is not None else priority
        with self.store.lock():
            self.sampler.update(index.reshape(-1).cpu().numpy(), priority)

    def state_dict(self) -> dict[str, Any]:
        """Counters and layout, the uniform RNG and the sampler (the data stays in the files)."""
        return ring_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Reopen the files in place with the layout and counters of :meth:`state_dict`, then restore the rest."""
        restore_ring(self, state, keep_data=True)

    def dump(self, path: str | os.PathLike, previous: str | os.PathLike | None = None) -> None:
        """Save the state and the filled part of the data to ``path`` (:func:`~tdrl.replay.persistence.dump_ring`)."""
        dump_ring(self, path, previous)

    def load(self, path: str | os.PathLike) -> None:
        """Restore what :meth:`dump` wrote (:func:`~tdrl.replay.persistence.load_ring`)."""
        load_ring(self, path)
