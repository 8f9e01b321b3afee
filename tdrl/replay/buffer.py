"""Transition replay: uniform or prioritized, n-step, optional frame de-duplication, shareable across processes.

See :mod:`tdrl.replay` for the keys a sample carries. Composes a :class:`~tdrl.replay.ring.StreamRing`, an optional
:class:`~tdrl.replay.prioritized.PrioritizedSampler` (``None``: uniform) and an optional
:class:`~tdrl.replay.frames.FrameStack`. A start at absolute time ``a`` is sampleable once its whole n-step window
(with a frame stack, one step more: the next stack's frame) is written, while it and the history frames of its stack
are not overwritten, and where the validity mask (``mask_key``, from wait-reset collectors) is True.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.nstep import nstep_returns
from tdrl.replay.prioritized import PrioritizedSampler, check_priorities, priority_update_args
from tdrl.replay.ring import StreamRing, gather_consistent, nest
from tdrl.replay.schema import ReplayError, as_key, key_name

__all__ = ["TransitionReplayBuffer"]


class TransitionReplayBuffer:
    """Memmap-backed transition replay with n-step returns.

    Args:
        scratch_dir: directory for the memmapped storage (explicit; put it under the run directory).
        capacity: transitions held (``T_cap = capacity // B`` time steps per environment stream).
        sampler: ``None`` for uniform sampling, or a :class:`PrioritizedSampler`.
        n_step, gamma: n-step return horizon (> 1 needs ``[B, T]`` batches) and its discount (the loss's gamma).
        frame_stack: a :class:`~tdrl.replay.frames.FrameStack` to store stacked image observations once per frame.
        mask_key: per-step validity mask of wait-reset collectors; False steps are never sampled.
        priority_key: per-step input priorities of a batch, for new data of a prioritized sampler; not stored.
        keys, exclude_keys: store only these keys (default: every tensor leaf of the first batch) / never these.
        seed: seed of the uniform index generator.
    """

    def __init__(self, scratch_dir: str | os.PathLike, capacity: int, *, sampler: PrioritizedSampler | None = None,
                 n_step: int = 1, gamma: float = 0.99, frame_stack: Any = None,
                 mask_key: NestedKey | None = ("collector", "mask"), priority_key: NestedKey = "priority",
                 keys: Sequence[NestedKey] | None = None, exclude_keys: Sequence[NestedKey] = (),
                 seed: int | None = None) -> None:
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.sampler = sampler
        self.frame_stack = frame_stack
        self.mask_key = as_key(mask_key) if mask_key is not None else None
        self.priority_key = as_key(priority_key)
        exclude = [self.priority_key, *exclude_keys]
        if frame_stack is not None:
            exclude += frame_stack.keys
        self.ring = StreamRing(scratch_dir, capacity, keys=keys, exclude_keys=exclude)
        self.rng = np.random.default_rng(seed)

    def _ready(self) -> bool:
        return self.ring.ready(self.sampler, self.mask_key)

    @property
    def write_count(self) -> int:
        """Transitions written so far by any process; a trainer throttles its replay ratio on it."""
        return self.ring.write_count

    @property
    def samples_drawn(self) -> int:
        return self.ring.store.counter("samples_drawn")

    def __len__(self) -> int:
        """Transitions currently stored."""
        return self.ring.stored

    @property
    def lookback(self) -> int:
        return self.frame_stack.n_frames - 1 if self.frame_stack is not None else 0

    @property
    def lookahead(self) -> int:
        """Steps after the start a sample reads (window end, plus the frame of the next observation)."""
        return self.n_step - 1 + (1 if self.frame_stack is not None else 0)

    def valid_range(self, done: int) -> tuple[int, int]:
        """``[lo, hi]`` absolute start times sampleable once ``done`` steps are complete (empty if ``hi < lo``)."""
        lo = 0 if done <= self.ring.time_capacity else done - self.ring.time_capacity + self.lookback
        return lo, done - 1 - self.lookahead

    def extend(self, batch: TensorDictBase) -> None:
        """Write a ``[B, T]`` collector batch (or a flat ``[N]`` batch into a one-stream buffer).

        Raises:
            ReplayError: wrong keys, dtypes or shapes, bad input priorities; nothing is written then.
        """
        if not self._ready():
            self._allocate(batch)
        columns, steps = self.ring.check(batch)
        priority = self.ring.step_priorities(batch, self.priority_key, steps) if self.sampler else None
        frames = self.frame_stack.prepare(self.ring, batch, steps) if self.frame_stack is not None else None
        start = self.ring.store.begin_write(steps)
        if self.sampler is not None:
            lo_old, hi_old = self.valid_range(start)
            lo_new, _ = self.valid_range(start + steps)
            with self.ring.store.lock():
                self.sampler.invalidate(self.ring.columns_of(lo_old, min(lo_new, hi_old + 1)))
        self.ring.write_columns(columns, start)
        if frames is not None:
            self.frame_stack.write(self.ring, frames, start)
        self.ring.store.end_write()
        if self.sampler is not None:
            self._activate(start, steps, priority)

    def _allocate(self, batch: TensorDictBase) -> None:
        if batch.batch_dims == 1 and (self.n_step > 1 or self.frame_stack is not None):
            raise ReplayError(f"flat [N] batches carry no time order; n_step={self.n_step} and frame stacks need "
                              f"[B, T] collector batches")
        extra = {}
        if self.frame_stack is not None:
            num_streams = 1 if batch.batch_dims == 1 else int(batch.batch_size[0])
            time_capacity = self.ring.capacity_requested // num_streams
            extra = self.frame_stack.fields(batch, num_streams, time_capacity)
        self.ring.allocate(batch, extra, {"kind": "transition", "n_step": self.n_step})
        if self.n_step > 1:
            for key in (("next", "reward"), ("next", "done")):
                if key not in self.ring.schema.entries:
                    raise ReplayError(f"n_step={self.n_step} needs key {key_name(key)!r} in the batch")
        if self.sampler is not None:
            self.sampler.bind(self.ring.capacity, self.ring.store.directory)
        self._ready()

    def _activate(self, start: int, steps: int, priority: np.ndarray | None) -> None:
        """Give the new slots their priorities and make the newly complete windows sampleable."""
        new = self.ring.columns_of(start, start + steps)
        lo, hi = self.valid_range(start + steps)
        ready = self.ring.columns_of(max(lo, start - self.lookahead), hi + 1)
        mask_ready = self.ring.valid_at(*np.divmod(ready, self.ring.time_capacity))
        with self.ring.store.lock():
            self.sampler.assign(new, priority, valid=np.zeros(new.shape, dtype=bool))
            self.sampler.activate(ready, valid=mask_ready)
            self.sampler.advance(steps * self.ring.num_streams)

    def sample(self, batch_size: int) -> TensorDict:
        """Draw ``batch_size`` transitions, with replacement, as a flat TensorDict ``[batch_size]`` (keys: see
        :mod:`tdrl.replay`). The batch may be larger than the transitions ready (SB3 starts learning at 100
        transitions with batch 256).

        Raises:
            ReplayError: no transition is ready to sample yet.
        """
        if batch_size < 1:
            raise ReplayError(f"batch_size must be >= 1, got {batch_size}")
        if not self._ready() or self.ready_count() < 1:
            raise ReplayError(f"no transition is ready to sample ({len(self)} stored; the newest {self.lookahead} "
                              "steps per stream wait for their n-step window)")
        stream, time, values, out = gather_consistent(self.ring, batch_size, self._draw, self._gather,
                                                      lambda time: time - self.lookback)
        out.set("index", torch.from_numpy(self.ring.flat_index(stream, time)))
        if values is not None:
            out.set("priority_weight", torch.from_numpy(self.sampler.importance_weights(values)))
        self.ring.store.add_counter("samples_drawn", batch_size)
        return out

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(stream, absolute time, leaf values or None)`` of ``n`` draws from the data complete now."""
        if self.sampler is not None:
            leaves, values, done = self.ring.draw_leaves(self.sampler, n)
            stream, time = self.ring.absolute_time(leaves, done)
            return stream, time, values
        # lower bound from write_started: slots of a write in progress are never drawn
        started, done = self.ring.write_started, self.ring.write_done
        lo, hi = self.valid_range(done)
        lo = max(lo, self.valid_range(started)[0])
        stream, time = self.ring.draw_uniform(self.rng, n, lo, hi)
        return stream, time, None

    def ready_count(self, done: int | None = None) -> int:
        """Transitions whose window is complete (sampleable, ignoring the validity mask)."""
        if not self._ready():
            return 0
        done = self.ring.write_done if done is None else done
        lo, hi = self.valid_range(done)
        return max(0, hi - lo + 1) * self.ring.num_streams

    def _gather(self, stream: np.ndarray, time: np.ndarray) -> TensorDict:
        ring = self.ring
        index = torch.from_numpy(ring.flat_index(stream, time))
        n = index.shape[0]
        if self.n_step == 1:
            last = index
            values = ring.gather_keys(index)
        else:
            window = torch.from_numpy(ring.flat_index(stream[:, None], time[:, None] + np.arange(self.n_step)))
            reward = ring.gather(("next", "reward"), window.reshape(-1)).view(n, self.n_step, -1)
            done = ring.gather(("next", "done"), window.reshape(-1)).view(n, self.n_step, -1)
            reward_n, steps = nstep_returns(reward, done, self.gamma)
            last = window[torch.arange(n), steps - 1]
            values = ring.gather_keys(index, "root")
            values.update(ring.gather_keys(last, "next"))
            values[("next", "reward")] = reward_n
            values[("steps_to_next_obs",)] = steps.unsqueeze(-1)
        if self.frame_stack is not None:
            values.update(self.frame_stack.gather(ring, index, last))
        return nest(values, [n])

    def update_priority(self, index: torch.Tensor | TensorDictBase, priority: torch.Tensor | None = None) -> None:
        """Set new priorities (e.g. ``|TD error|``) for sampled transitions.

        Args:
            index: the sample's ``index`` tensor, or the sampled TensorDict itself (then ``priority`` defaults to
                its ``"td_error"`` entry, as TorchRL losses write it).
            priority: one non-negative finite value per index.
        """
        index, priority = priority_update_args(self.sampler, index, priority)
        index_np = index.reshape(-1).cpu().numpy()
        priority_np = check_priorities(priority)
        if priority_np.size != index_np.size:
            raise ReplayError(f"priority has {priority_np.size} values for {index_np.size} indices")
        if index_np.size and (index_np.min() < 0 or index_np.max() >= self.ring.capacity):
            raise ReplayError(f"index out of range [0, {self.ring.capacity}) in priority update")
        with self.ring.store.lock():
            self.sampler.update(index_np, priority_np, checked=True)

    def state_dict(self) -> dict[str, Any]:
        """Counters, layout, uniform RNG state and sampler state. The stored data is not included: it stays in
        ``scratch_dir``, and a buffer built on the same directory reopens it with :meth:`load_state_dict`."""
        return {**self.ring.buffer_state(self.rng, self.sampler), "n_step": self.n_step, "gamma": self.gamma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the data files must be in this buffer's ``scratch_dir`` (same directory, or
        copied there by :meth:`loads`)."""
        if state["n_step"] != self.n_step:
            raise ReplayError(f"state has n_step={state['n_step']}, this buffer n_step={self.n_step}")
        self.ring.load_buffer_state(state, self.rng, self.sampler)

    def dumps(self, path: str | os.PathLike) -> None:
        """Write a complete copy (data files + state) to ``path``; only the state when ``path`` is ``scratch_dir``."""
        self.ring.dump(path, self.state_dict())

    def loads(self, path: str | os.PathLike) -> None:
        """Restore a copy written by :meth:`dumps` into this buffer's ``scratch_dir``."""
        self.ring.load(path, self.load_state_dict)
