"""Sequence replay for recurrent agents (R2D1): sequences start only where a recurrent state was stored.

Every ``rnn_state_interval`` steps of each stream (absolute times ``0, I, 2I, ...``) the buffer keeps the recurrent
state the policy read at that step (``state_keys``; ``("next", <state key>)`` is not stored). Only those steps start
sequences, so each begins with a valid stored state at ``1/I`` of the memory (rlpyt's ``store_rnn_state_interval``).

``sample(batch_B)`` returns ``[batch_B, L]``, ``L = warmup_T + batch_T + lookahead_T`` consecutive steps of one
stream each (they may cross episodes; ``is_init``, ``done`` and the mask say where): every stored key; each state
key's stored initial state broadcast along time (a stride-0 view; read ``[:, 0]``, as TorchRL's ``LSTMModule``
takes it); ``index`` and, prioritized, ``priority_weight`` broadcast the same way. ``warmup_T`` steps burn in the
state, ``batch_T`` train, ``lookahead_T`` complete the n-step targets of the last trained steps.

Prioritized: one tree leaf per stored start; ``update_priority`` takes one priority per sequence, or per-step
``|TD|`` ``[batch_B, T]`` reduced as ``eta * max + (1 - eta) * mean`` (R2D1, ``pri_eta=0.9``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.prioritized import PrioritizedSampler, check_priorities, priority_update_args
from tdrl.replay.ring import StreamRing, gather_consistent, nest
from tdrl.replay.schema import ReplayError, as_key, key_name

__all__ = ["SequenceReplayBuffer", "sequence_priority"]


def sequence_priority(td_error: torch.Tensor, eta: float = 0.9) -> torch.Tensor:
    """R2D1 sequence priority ``eta * max_t |td| + (1 - eta) * mean_t |td|`` over the last dim of ``[N, T]``."""
    abs_td = td_error.detach().abs().reshape(td_error.shape[0], -1)
    return eta * abs_td.max(dim=1).values + (1.0 - eta) * abs_td.mean(dim=1)


class SequenceReplayBuffer:
    """Memmap-backed R2D1 sequence replay.

    Args:
        capacity: time steps held over all streams (``T_cap = capacity // B``, a multiple of the interval).
        batch_T, warmup_T, lookahead_T: trained steps per sequence, burn-in before them, n-step steps after.
        rnn_state_interval: store the recurrent state every this many steps; sequences start only there.
        state_keys: keys of the recurrent state the policy read at each step.
        sampler: ``None`` (uniform over stored starts) or a :class:`PrioritizedSampler` (one leaf per start).
        pri_eta: max/mean mix for per-step TD errors passed to :meth:`update_priority`.
        Others as in :class:`~tdrl.replay.buffer.TransitionReplayBuffer`; ``mask_key`` marks invalid starts.
    """

    def __init__(self, scratch_dir: str | os.PathLike, capacity: int, *, batch_T: int, warmup_T: int = 0,
                 lookahead_T: int = 0, rnn_state_interval: int, state_keys: Sequence[NestedKey],
                 sampler: PrioritizedSampler | None = None, pri_eta: float = 0.9,
                 mask_key: NestedKey | None = ("collector", "mask"), priority_key: NestedKey = "priority",
                 keys: Sequence[NestedKey] | None = None, exclude_keys: Sequence[NestedKey] = (),
                 seed: int | None = None) -> None:
        if batch_T < 1 or warmup_T < 0 or lookahead_T < 0 or rnn_state_interval < 1:
            raise ValueError("need batch_T >= 1, warmup_T >= 0, lookahead_T >= 0, rnn_state_interval >= 1")
        if not state_keys:
            raise ValueError("state_keys must name at least one recurrent-state key")
        self.seq_len = int(warmup_T + batch_T + lookahead_T)
        self.warmup_T, self.batch_T, self.lookahead_T = int(warmup_T), int(batch_T), int(lookahead_T)
        self.interval = int(rnn_state_interval)
        self.state_keys = [as_key(k) for k in state_keys]
        self.sampler = sampler
        self.pri_eta = float(pri_eta)
        self.mask_key = as_key(mask_key) if mask_key is not None else None
        self.priority_key = as_key(priority_key)
        exclude = [self.priority_key, *self.state_keys, *(("next", *k) for k in self.state_keys), *exclude_keys]
        self.ring = StreamRing(scratch_dir, capacity, keys=keys, exclude_keys=exclude,
                               time_multiple=self.interval)
        self.rng = np.random.default_rng(seed)

    def _ready(self) -> bool:
        return self.ring.ready(self.sampler, self.mask_key)

    @property
    def starts_per_stream(self) -> int:
        return self.ring.time_capacity // self.interval

    @property
    def num_starts(self) -> int:
        """Stored-state slots (tree leaves) over all streams."""
        return self.ring.num_streams * self.starts_per_stream

    def _allocate(self, batch: TensorDictBase) -> None:
        if batch.batch_dims != 2:
            raise ReplayError(f"sequence replay needs [B, T] collector batches, got batch_size "
                              f"{list(batch.batch_size)}")
        B = int(batch.batch_size[0])
        starts = self.ring.capacity_requested // B // self.interval
        if starts * self.interval < self.seq_len:
            raise ReplayError(f"capacity {self.ring.capacity_requested} holds {starts * self.interval} steps per "
                              f"stream, fewer than one sequence (L={self.seq_len})")
        extra = {}
        for key in self.state_keys:
            value = batch.get(key, None)
            if value is None:
                raise ReplayError(f"batch is missing recurrent-state key {key_name(key)!r}")
            extra["state." + key_name(key)] = ((B, starts, *value.shape[2:]), value.dtype)
        self.ring.allocate(batch, extra, {"kind": "sequence", "interval": self.interval})
        if self.sampler is not None:
            self.sampler.bind(self.num_starts, self.ring.store.directory)
        self._ready()

    def __len__(self) -> int:
        return self.ring.stored

    @property
    def samples_drawn(self) -> int:
        """Sequences sampled so far, times ``L`` (time steps replayed)."""
        return self.ring.store.counter("samples_drawn")

    @property
    def write_count(self) -> int:
        return self.ring.write_count

    def start_range(self, done: int) -> tuple[int, int]:
        """``[lo, hi]`` start numbers (absolute time / interval) sampleable once ``done`` steps are complete."""
        oldest = max(0, done - self.ring.time_capacity)
        return -(-oldest // self.interval), (done - self.seq_len) // self.interval

    def ready_count(self, done: int | None = None) -> int:
        if not self._ready():
            return 0
        lo, hi = self.start_range(self.ring.write_done if done is None else done)
        return max(0, hi - lo + 1) * self.ring.num_streams

    def _leaves(self, start_lo: int, start_hi: int) -> np.ndarray:
        """Leaves of start numbers ``[start_lo, start_hi)`` in every stream."""
        starts = np.arange(max(start_lo, 0), max(start_hi, 0), dtype=np.int64) % self.starts_per_stream
        streams = np.arange(self.ring.num_streams, dtype=np.int64)
        return (streams[:, None] * self.starts_per_stream + starts[None, :]).reshape(-1)

    def extend(self, batch: TensorDictBase) -> None:
        """Write a ``[B, T]`` collector batch; raises :class:`ReplayError` (writing nothing) on a bad batch."""
        if not self._ready():
            self._allocate(batch)
        if batch.batch_dims != 2:
            raise ReplayError(f"sequence replay needs [B, T] batches, got batch_size {list(batch.batch_size)}")
        columns, steps = self.ring.check(batch)
        states = {}
        for key in self.state_keys:
            value = batch.get(key, None)
            target = self.ring.field("state." + key_name(key))
            if value is None:
                raise ReplayError(f"batch is missing recurrent-state key {key_name(key)!r}")
            if value.dtype != target.dtype or value.shape[2:] != target.shape[2:]:
                raise ReplayError(f"key {key_name(key)!r} has dtype {value.dtype} and per-step shape "
                                  f"{tuple(value.shape[2:])}, the buffer stores {target.dtype} "
                                  f"{tuple(target.shape[2:])}")
            states[key] = value.cpu()
        priority = self.ring.step_priorities(batch, self.priority_key, steps) if self.sampler else None
        start = self.ring.store.begin_write(steps)
        first = (-start) % self.interval  # first step of this batch at a state boundary
        if self.sampler is not None:
            lo_old, hi_old = self.start_range(start)
            lo_new, _ = self.start_range(start + steps)
            with self.ring.store.lock():
                self.sampler.invalidate(self._leaves(lo_old, min(lo_new, hi_old + 1)))
        self.ring.write_columns(columns, start)
        for key, value in states.items():
            sub = value[:, first :: self.interval]
            if sub.shape[1]:
                self.ring.write(self.ring.field("state." + key_name(key)), sub, start + first, self.interval)
        self.ring.store.end_write()
        if self.sampler is not None:
            self._activate(start, steps, priority, first)

    def _activate(self, start: int, steps: int, priority: np.ndarray | None, first: int) -> None:
        new_lo, new_hi = -(-start // self.interval), -(-(start + steps) // self.interval)
        new = self._leaves(new_lo, new_hi)
        if priority is not None:
            priority = priority[:, first :: self.interval].reshape(-1)
        _, hi_old = self.start_range(start)
        lo, hi = self.start_range(start + steps)
        ready_lo = max(lo, hi_old + 1)
        ready = self._leaves(ready_lo, hi + 1)
        streams, times = np.arange(self.ring.num_streams)[:, None], np.arange(ready_lo, hi + 1)[None, :]
        valid = self.ring.valid_at(streams, times * self.interval) if ready.size else None
        with self.ring.store.lock():
            if new.size:
                self.sampler.assign(new, priority, valid=np.zeros(new.shape, dtype=bool))
            self.sampler.activate(ready, valid=valid)
            self.sampler.advance(steps * self.ring.num_streams)

    def sample(self, batch_B: int) -> TensorDict:
        """Draw ``batch_B`` sequences as a TensorDict ``[batch_B, L]`` (see module docstring)."""
        if batch_B < 1:
            raise ReplayError(f"batch_B must be >= 1, got {batch_B}")
        if not self._ready() or batch_B > self.ready_count():
            raise ReplayError(f"batch_B={batch_B} exceeds the {self.ready_count()} sequences ready to sample "
                              f"({len(self)} steps stored; a sequence needs L={self.seq_len} steps)")
        stream, start_no, values, gathered = gather_consistent(self.ring, batch_B, self._draw, self._gather,
                                                               lambda start_no: start_no * self.interval)
        out = gathered["steps"]
        for key in self.state_keys:  # stride-0 views along time: one stored state per sequence
            value = gathered[key]
            out[key] = value.unsqueeze(1).expand(batch_B, self.seq_len, *value.shape[1:])
        leaf = stream * self.starts_per_stream + start_no % self.starts_per_stream
        out["index"] = torch.from_numpy(leaf).unsqueeze(1).expand(batch_B, self.seq_len)
        if values is not None:
            weights = self.sampler.importance_weights(values)
            out["priority_weight"] = torch.from_numpy(weights).unsqueeze(1).expand(batch_B, self.seq_len)
        self.ring.store.add_counter("samples_drawn", batch_B * self.seq_len)
        return out

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(stream, start number, leaf values or None)`` of ``n`` draws from the data complete now."""
        if self.sampler is not None:
            leaves, values, done = self.ring.draw_leaves(self.sampler, n)
            stream, slot = np.divmod(leaves, self.starts_per_stream)
            newest = (done - self.seq_len) // self.interval  # newest ready start number
            return stream, newest - (newest - slot) % self.starts_per_stream, values
        started, done = self.ring.write_started, self.ring.write_done
        lo, hi = self.start_range(done)
        lo = max(lo, self.start_range(started)[0])  # never draw slots a write in progress is replacing
        stream, start_no = self.ring.draw_uniform(self.rng, n, lo, hi, self.interval)
        return stream, start_no, None

    def _gather(self, stream: np.ndarray, start_no: np.ndarray) -> TensorDict:
        """``[n]``: the sequences ``[n, L]`` of the stored keys under ``"steps"``, and each stored initial state."""
        n, L = stream.shape[0], self.seq_len
        times = start_no[:, None] * self.interval + np.arange(L)[None, :]
        index = torch.from_numpy(self.ring.flat_index(stream[:, None], times).reshape(-1))
        values = {k: v.view(n, L, *v.shape[1:]) for k, v in self.ring.gather_keys(index).items()}
        state_index = torch.from_numpy(stream * self.starts_per_stream + start_no % self.starts_per_stream)
        out = {("steps",): nest(values, [n, L])}
        for key in self.state_keys:
            field = self.ring.field("state." + key_name(key))
            out[key] = torch.index_select(field.view(-1, *field.shape[2:]), 0, state_index)
        return nest(out, [n])

    def update_priority(self, index: torch.Tensor | TensorDictBase, priority: torch.Tensor | None = None) -> None:
        """New priorities for sampled sequences.

        Args:
            index: the sample's ``index`` (``[batch_B]`` or the broadcast ``[batch_B, L]``), or the sample itself
                (then ``priority`` defaults to its ``"td_error"``).
            priority: ``[batch_B]`` per-sequence priorities, or ``[batch_B, T]`` per-step TD errors reduced with
                :func:`sequence_priority` (``eta = pri_eta``).
        """
        index, priority = priority_update_args(self.sampler, index, priority)
        if index.ndim == 2:
            index = index[:, 0]
        priority = torch.as_tensor(priority)
        check_priorities(priority.abs() if priority.ndim == 2 else priority)
        if priority.ndim == 2:
            priority = sequence_priority(priority, self.pri_eta)
        if priority.numel() != index.numel():
            raise ReplayError(f"priority has {priority.numel()} values for {index.numel()} sequences")
        with self.ring.store.lock():
            self.sampler.update(index.cpu().numpy(), check_priorities(priority))

    def state_dict(self) -> dict[str, Any]:
        """Counters, layout, RNG and sampler state; the data stays in ``scratch_dir`` (see :mod:`tdrl.replay`)."""
        return self.ring.buffer_state(self.rng, self.sampler)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ring.load_buffer_state(state, self.rng, self.sampler)

    def dumps(self, path: str | os.PathLike) -> None:
        """Full copy (data + state) into ``path``; only the state when ``path`` is ``scratch_dir``."""
        self.ring.dump(path, self.state_dict())

    def loads(self, path: str | os.PathLike) -> None:
        """Restore what :meth:`dumps` wrote."""
        self.ring.load(path, self.load_state_dict)
