"""Sequence replay for recurrent agents (R2D1): sequences start only where a recurrent state was stored.

Every ``rnn_state_interval`` steps of each stream (absolute times ``0, I, 2I, ...``) the buffer keeps the recurrent
state the policy read at that step (``state_keys``; ``("next", <state key>)`` is not stored). Only those steps start
sequences, so each begins with a valid stored state at ``1/I`` of the memory (rlpyt's ``store_rnn_state_interval``).

``sample(batch_B)`` returns ``[batch_B, L]``, ``L = warmup_T + batch_T + lookahead_T`` consecutive steps of one
stream each (they may cross episodes; ``is_init``, ``done`` and the mask say where): every stored key; each state
key's stored initial state broadcast along time (a stride-0 view; read ``[:, 0]``, as TorchRL's ``LSTMModule``
takes it); ``index`` and, prioritized, ``priority_weight`` (one tree leaf per stored start) broadcast the same way.
``warmup_T`` steps burn in the state, ``batch_T`` train, ``lookahead_T`` complete the n-step targets of the last
trained steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.device import deliver, sample_device
from tdrl.replay.prioritized import PrioritizedSampler
from tdrl.replay.ring import StreamRing
from tdrl.replay.schema import BatchSchema, ReplayError, as_key, key_name, nest
from tdrl.utils.files import LinkingWriter
from tdrl.utils.keys import MASK_KEY, WEIGHT_KEY
from tdrl.utils.returns import sequence_priority

__all__ = ["SequenceReplayBuffer"]


class SequenceReplayBuffer:
    """Memmap-backed R2D1 sequence replay.

    Args:
        capacity: time steps held over all streams (``T_cap = capacity // B``, a multiple of the interval).
        batch_T, warmup_T, lookahead_T: trained steps per sequence, burn-in before them, n-step steps after.
        rnn_state_interval: store the recurrent state every this many steps; sequences start only there.
        state_keys: keys of the recurrent state the policy read at each step.
        sampler: ``None`` (uniform over stored starts) or a :class:`PrioritizedSampler` (one leaf per start).
        pri_eta: max/mean mix for per-step TD errors passed to :meth:`update_priority`.
        input_priority: with a sampler, ``f(batch) -> [B, T]`` priorities of each new batch's steps (R2D1's input
            priorities: the steps that start sequences get theirs); a picklable callable, as it travels with the
            buffer to an async collector process. ``None``: a batch's own ``"priority"`` key, else the default.
        Others as in :class:`~tdrl.replay.buffer.TransitionReplayBuffer` (``device``: where samples are returned);
        ``mask_key`` marks invalid starts.
    """

    def __init__(self, scratch_dir: str | os.PathLike, capacity: int, *, batch_T: int, warmup_T: int = 0,
                 lookahead_T: int = 0, rnn_state_interval: int, state_keys: Sequence[NestedKey],
                 sampler: PrioritizedSampler | None = None, pri_eta: float = 0.9,
                 mask_key: NestedKey | None = MASK_KEY, keys: Sequence[NestedKey] | None = None,
                 input_priority: Callable[[TensorDictBase], torch.Tensor] | None = None,
                 seed: int | None = None, device: str | torch.device | None = None) -> None:
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
        self.input_priority = input_priority
        self.device = sample_device(device)
        exclude = [*self.state_keys, *(("next", *k) for k in self.state_keys)]
        self.ring = StreamRing(scratch_dir, capacity, {"kind": "sequence", "interval": self.interval}, keys=keys,
                               exclude_keys=exclude, stride=self.interval, lookahead=self.seq_len - 1,
                               sampler=sampler, mask_key=mask_key, seed=seed)

    def __len__(self) -> int:
        return self.ring.stored

    @property
    def samples_drawn(self) -> int:
        """Time steps replayed so far (sequences times ``L``)."""
        return self.ring.store.counter("samples_drawn")

    @property
    def write_count(self) -> int:
        return self.ring.write_count

    def ready_count(self) -> int:
        """Sequences ready to sample (ignoring the validity mask)."""
        return self.ring.ready_count()

    def extend(self, batch: TensorDictBase) -> None:
        """Write a ``[B, T]`` collector batch; raises :class:`ReplayError` (writing nothing) on a bad batch."""
        if not self.ring.allocated:
            self._allocate(batch)
        if self.input_priority is not None and self.sampler is not None:
            batch = batch.copy().set("priority", self.input_priority(batch))  # shallow: the caller's batch is kept
        columns, steps, priority = self.ring.check(batch)
        fields = {key: self.ring.field("state." + key_name(key)) for key in self.state_keys}
        schema = BatchSchema({key: (field.dtype, field.shape[2:]) for key, field in fields.items()}, strict=False)
        states = schema.check(batch, batch.batch_size)
        start = self.ring.begin_write(steps)
        self.ring.write_columns(columns, start)
        first = (-start) % self.interval  # first step of this batch at a state boundary
        for key, value in states.items():
            self.ring.write(fields[key], value[:, first :: self.interval], start + first, self.interval)
        self.ring.end_write(start, steps, priority)

    def _allocate(self, batch: TensorDictBase) -> None:
        if batch.batch_dims != 2:
            raise ReplayError(f"sequence replay needs [B, T] collector batches, got batch_size "
                              f"{list(batch.batch_size)}")
        per_stream = self.ring.capacity_requested // int(batch.batch_size[0]) // self.interval * self.interval
        if per_stream < self.seq_len:
            raise ReplayError(f"capacity {self.ring.capacity_requested} holds {per_stream} steps per stream, "
                              f"fewer than one sequence (L={self.seq_len})")
        states = BatchSchema.from_batch(batch, 2, self.state_keys).entries

        def state_fields(num_streams: int, time_capacity: int) -> dict[str, Any]:
            slots = time_capacity // self.interval  # one state every `interval` ring steps: its cursor
            return {"state." + key_name(key): ((num_streams, slots, *shape), dtype, self.interval)
                    for key, (dtype, shape) in states.items()}

        self.ring.allocate(batch, state_fields)

    def sample(self, batch_B: int) -> TensorDict:
        """Draw ``batch_B`` sequences as a TensorDict ``[batch_B, L]`` (see module docstring)."""
        if batch_B < 1:
            raise ReplayError(f"batch_B must be >= 1, got {batch_B}")
        if batch_B > self.ready_count():
            raise ReplayError(f"batch_B={batch_B} exceeds the {self.ready_count()} sequences ready to sample "
                              f"({len(self)} steps stored; a sequence needs L={self.seq_len} steps)")
        index, gathered, weights = self.ring.sample(batch_B, self._gather)
        gathered = deliver(gathered, index, weights, self.device)  # before the broadcasts: one row per sequence
        out = gathered["steps"]
        broadcast = [*self.state_keys, "index", *([WEIGHT_KEY] if weights is not None else [])]
        for key in broadcast:  # stride-0 views along time: one stored state (index, weight) per sequence
            value = gathered[key]
            out[key] = value.unsqueeze(1).expand(batch_B, self.seq_len, *value.shape[1:])
        self.ring.store.add_counter("samples_drawn", batch_B * self.seq_len)
        return out

    def _gather(self, stream: np.ndarray, start_no: np.ndarray) -> TensorDict:
        """``[n]``: the sequences ``[n, L]`` of the stored keys under ``"steps"``, and each stored initial state."""
        n, L = stream.shape[0], self.seq_len
        times = start_no[:, None] * self.interval + np.arange(L)[None, :]
        index = torch.from_numpy(self.ring.flat_index(stream[:, None], times).reshape(-1))
        values = {k: v.view(n, L, *v.shape[1:]) for k, v in self.ring.gather_keys(index, device=self.device).items()}
        state_index = torch.from_numpy(self.ring.leaf(stream, start_no))
        out: dict[tuple[str, ...], torch.Tensor | TensorDictBase] = {("steps",): nest(values, [n, L])}
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
        def reduce(priority: torch.Tensor) -> torch.Tensor:
            return sequence_priority(priority, self.pri_eta) if priority.ndim == 2 else priority

        self.ring.update_priority(index, priority, reduce)

    def state_dict(self) -> dict[str, Any]:
        """Counters, layout, RNG and sampler state; the data stays in ``scratch_dir`` (see :mod:`tdrl.replay`)."""
        return self.ring.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ring.load_state_dict(state)

    def dumps(self, path: str | os.PathLike, previous: str | os.PathLike | None = None) -> None:
        """Copy (filled data + state) into ``path``, linking what is unchanged since the copy in ``previous``."""
        self.ring.dump(path, previous)

    def checkpoint_writer(self) -> LinkingWriter:
        """:meth:`dumps` for ``extra_writers``: a checkpoint shares the unchanged sequences with the one before."""
        return LinkingWriter(self.dumps)

    def loads(self, path: str | os.PathLike) -> None:
        """Restore what :meth:`dumps` wrote."""
        self.ring.load(path)
