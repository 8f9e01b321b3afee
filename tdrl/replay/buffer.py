"""Transition replay: uniform or prioritized, n-step, optional frame de-duplication (keys: see :mod:`tdrl.replay`).

A start is sampleable once its whole n-step window (with a frame stack, one step more: the next stack's frame) is
written, while it and the history frames of its stack are not overwritten, and where the validity mask is True.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.device import DeviceCopy, deliver, fits_on_device, sample_device, staged
from tdrl.replay.frames import FrameCopy, FrameStack
from tdrl.replay.prioritized import PrioritizedSampler
from tdrl.replay.ring import StreamRing
from tdrl.replay.schema import ReplayError, key_name, nest
from tdrl.utils.files import LinkingWriter
from tdrl.utils.keys import MASK_KEY, STEPS_KEY
from tdrl.utils.returns import nstep_returns

__all__ = ["TRANSITION_KEYS", "TransitionReplayBuffer", "grouped_transition_keys"]


TRANSITION_KEYS = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                   ("next", "terminated"), ("next", "truncated")]
"""What a feed-forward off-policy recipe stores per transition (``keys=`` of :class:`TransitionReplayBuffer`)."""


def grouped_transition_keys(observation_spec: Any) -> list[NestedKey]:
    """What a multi-agent off-policy recipe stores per transition (``keys=`` of :class:`TransitionReplayBuffer`),
    from the env's observation spec (docs/design.md §1): each agent group's entries (``observation``, ``mask``,
    ``action_mask``) and ``action`` at ``t``, its entries and per-agent ``reward``/``done``/``terminated`` under
    ``next``; at the root the validity mask, the team's reward and flags under ``next`` and the global ``state``."""
    groups = [key for key in observation_spec.keys() if hasattr(observation_spec[key], "keys")]
    state = ["state"] if "state" in observation_spec.keys() else []
    now: list[NestedKey] = [(g, key) for g in groups for key in (*observation_spec[g].keys(), "action")]
    later: list[NestedKey] = [("next", g, key) for g in groups
                              for key in (*observation_spec[g].keys(), "reward", "done", "terminated")]
    return [*now, *state, MASK_KEY, *later, *(("next", key) for key in ("reward", "done", "terminated", "truncated",
                                                                          *state))]

class TransitionReplayBuffer:
    """Memmap-backed transition replay with n-step returns.

    Args:
        scratch_dir: directory for the memmapped storage (explicit; put it under the run directory).
        capacity: transitions held (``T_cap = capacity // B`` time steps per environment stream).
        sampler: ``None`` for uniform sampling, or a :class:`PrioritizedSampler` (new steps get the default priority,
            or a batch's per-step input priorities ``"priority"``, which are not stored).
        n_step, gamma: n-step return horizon (> 1 needs ``[B, T]`` batches) and its discount (the loss's gamma).
        frame_stack: a :class:`~tdrl.replay.frames.FrameStack` to store stacked image observations once per frame.
        mask_key: per-step validity mask of wait-reset collectors; False steps are never sampled.
        keys: store only these keys (default: every tensor leaf of the first batch).
        seed: seed of the uniform index generator; ``None``: drawn from torch's global generator, so a script
            that calls ``torch.manual_seed`` samples the same minibatches on every run.
        clip_reward: samples clip each step's reward to [-1, 1] before the n-step sum (rlpyt's Atari clipping);
            the stored rewards stay raw.
        device: where samples are returned (the learner's device); ``None`` leaves them on the host. The data stays
            in host memory: a GPU sample is gathered into pinned memory and copied without blocking the host.
        copy_on_device: also keep a copy of the stored data on ``device`` and gather samples there
            (:mod:`tdrl.replay.device`, writes in this process; a frame stack's frames too,
            :class:`~tdrl.replay.frames.FrameCopy`); ``None``: when ``device`` is a GPU and the data takes at most
            a quarter of its memory, and there is no frame stack (not yet measured on a GPU: ``True`` asks for it).
    """

    def __init__(self, scratch_dir: str | os.PathLike, capacity: int, *, sampler: PrioritizedSampler | None = None,
                 n_step: int = 1, gamma: float = 0.99, frame_stack: FrameStack | None = None,
                 mask_key: NestedKey | None = MASK_KEY, keys: Sequence[NestedKey] | None = None,
                 seed: int | None = None, clip_reward: bool = False, device: str | torch.device | None = None,
                 copy_on_device: bool | None = False) -> None:
        if n_step < 1 or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"need n_step >= 1 and gamma in [0, 1], got {n_step}, {gamma}")
        if copy_on_device and device is None:
            raise ValueError("copy_on_device=True needs device= (where the copy is kept)")
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.clip_reward = clip_reward
        self.device = sample_device(device)
        self.copy_on_device = False if frame_stack is not None and copy_on_device is None else copy_on_device
        self._copy: DeviceCopy | None = None
        self._frames: FrameCopy | None = None  # the frame stack's frames, with the device copy
        self._flat: dict[Any, torch.Tensor] | None = None  # the device copy's views during a sample
        self.sampler = sampler
        self.frame_stack = frame_stack
        stacked = frame_stack is not None
        # a sample reads the history frames of its stack before it, its window and the next stack's frame after it
        self.ring = StreamRing(scratch_dir, capacity, {"kind": "transition", "n_step": self.n_step}, keys=keys,
                               exclude_keys=frame_stack.keys if frame_stack is not None else (),
                               lookback=frame_stack.n_frames - 1 if frame_stack is not None else 0,
                               lookahead=self.n_step - 1 + stacked,
                               sampler=sampler, mask_key=mask_key, seed=seed)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_copy": None, "_frames": None}  # the device copy stays in this process

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

    def ready_count(self) -> int:
        """Transitions whose window is complete (sampleable, ignoring the validity mask)."""
        return self.ring.ready_count()

    def extend(self, batch: TensorDictBase) -> None:
        """Write a ``[B, T]`` collector batch (or a flat ``[N]`` batch into a one-stream buffer); raises
        :class:`ReplayError` (writing nothing) on wrong keys, dtypes or shapes or bad input priorities."""
        if not self.ring.allocated:
            self._allocate(batch)
        columns, steps, priority = self.ring.check(batch)
        frames = self.frame_stack.prepare(self.ring, batch, steps) if self.frame_stack is not None else None
        start = self.ring.begin_write(steps)
        self.ring.write_columns(columns, start)
        if frames is not None:
            assert self.frame_stack is not None  # it prepared the frames
            self.frame_stack.write(self.ring, frames, start)
        self.ring.end_write(start, steps, priority)

    def _allocate(self, batch: TensorDictBase) -> None:
        if batch.batch_dims == 1 and (self.n_step > 1 or self.frame_stack is not None):
            raise ReplayError(f"flat [N] batches carry no time order; n_step={self.n_step} and frame stacks need "
                              f"[B, T] collector batches")
        codec = functools.partial(self.frame_stack.fields, batch) if self.frame_stack is not None else None
        self.ring.allocate(batch, codec)
        assert self.ring.schema is not None  # allocate() adopted it
        if self.n_step > 1:
            for key in (("next", "reward"), ("next", "done")):
                if key not in self.ring.schema.entries:
                    raise ReplayError(f"n_step={self.n_step} needs key {key_name(key)!r} in the batch")

    def sample(self, batch_size: int) -> TensorDict:
        """Draw ``batch_size`` transitions, with replacement, as a flat TensorDict ``[batch_size]`` on ``device``
        (keys: see :mod:`tdrl.replay`); it may exceed the transitions ready (SB3 starts learning at 100 with batch
        256)."""
        if batch_size < 1:
            raise ReplayError(f"batch_size must be >= 1, got {batch_size}")
        if self.ring.ready_count() < 1:
            raise ReplayError(f"no transition is ready to sample ({len(self)} stored; the newest "
                              f"{self.ring.lookahead} steps per stream wait for their n-step window)")
        copy = self._device_copy()
        self._flat = copy.flat if copy is not None else None
        index, out, weights = self.ring.sample(batch_size, self._gather)
        self.ring.store.add_counter("samples_drawn", batch_size)
        return deliver(out, index, weights, self.device)

    def _device_copy(self) -> DeviceCopy | None:
        """The device copy, built at the first sample and refreshed at every one; ``None`` without one."""
        if self._copy is None:
            if not self.copy_on_device and (self.copy_on_device is not None or self.device is None):
                return None
            assert self.device is not None  # copy_on_device=True needs it (__init__), None only uses it with one
            if self.copy_on_device is None and not fits_on_device(self.ring, self.device):
                self.copy_on_device = False
                return None
            self._copy = DeviceCopy(self.ring, self.device)
            if self.frame_stack is not None:
                self._frames = FrameCopy(self.ring, self.device)
        self._copy.refresh(self.ring)
        if self._frames is not None:
            self._frames.refresh(self.ring)
        return self._copy

    def _gather(self, stream: np.ndarray, time: np.ndarray) -> TensorDict:
        ring, flat, device = self.ring, self._flat, self.device
        index = host_index = torch.from_numpy(ring.flat_index(stream, time))
        if flat is not None:  # gathered from the device copy: the indices go there
            assert device is not None  # the device copy's
            index = staged(index, device)
        n = index.shape[0]
        host_last = host_index  # where a frame stack's next stacks end (it reads its positions on the host)
        if self.n_step == 1:
            last = index
            values = ring.gather_keys(index, device=device, flat=flat)
            if self.clip_reward:
                values[("next", "reward")] = values[("next", "reward")].clamp(-1.0, 1.0)
        else:
            window = host_window = torch.from_numpy(ring.flat_index(stream[:, None],
                                                                    time[:, None] + np.arange(self.n_step)))
            if flat is not None:
                assert device is not None  # the device copy's
                window = staged(window, device)
            reward = ring.gather(("next", "reward"), window.reshape(-1), flat).view(n, self.n_step, -1)
            done = ring.gather(("next", "done"), window.reshape(-1), flat).view(n, self.n_step, -1)
            if self.clip_reward:
                reward = reward.clamp(-1.0, 1.0)
            reward_n, steps = nstep_returns(reward, done, self.gamma)
            last = window[torch.arange(n, device=window.device), steps - 1]
            if self.frame_stack is not None and flat is not None:  # the same steps from the host's done flags
                host_done = ring.gather(("next", "done"), host_window.reshape(-1)).view(n, self.n_step, -1)
                host_steps = nstep_returns(torch.zeros(host_done.shape), host_done, self.gamma)[1]
                host_last = host_window[torch.arange(n), host_steps - 1]
            elif self.frame_stack is not None:
                host_last = last
            values = ring.gather_keys(index, "root", device, flat)
            values.update(ring.gather_keys(last, "next", device, flat))
            values[("next", "reward")] = reward_n
            values[(STEPS_KEY,)] = steps.unsqueeze(-1)
        if self.frame_stack is not None:
            pixels = self._frames.pixels if self._frames is not None and flat is not None else None
            values.update(self.frame_stack.gather(ring, host_index, host_last, pixels))
        assert ring.schema is not None  # a sample comes after the first extend
        return nest(values, [n], ring.schema.sub_dims)

    def update_priority(self, index: torch.Tensor | TensorDictBase, priority: torch.Tensor | None = None) -> None:
        """Set new priorities (e.g. ``|TD error|``) for sampled transitions (see :meth:`StreamRing.update_priority`:
        ``index`` may be the sample itself, then ``priority`` defaults to its ``"td_error"``)."""
        self.ring.update_priority(index, priority)

    def state_dict(self) -> dict[str, Any]:
        """Counters, layout, uniform RNG state and sampler state. The stored data is not included: it stays in
        ``scratch_dir``, and a buffer built on the same directory reopens it with :meth:`load_state_dict`."""
        return self.ring.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; the data files must be in this buffer's ``scratch_dir`` (same directory, or
        copied there by :meth:`loads`)."""
        self.ring.load_state_dict(state)

    def dumps(self, path: str | os.PathLike, previous: str | os.PathLike | None = None) -> None:
        """Write a complete copy (the filled part of the data + state) to ``path``, hard-linking the data unchanged
        since the copy in ``previous``; only the state when ``path`` is ``scratch_dir``."""
        self.ring.dump(path, previous)

    def checkpoint_writer(self) -> LinkingWriter:
        """:meth:`dumps` as a checkpoint's ``extra_writers`` entry: each checkpoint links the data unchanged since
        the one before, so it costs the data collected in between."""
        return LinkingWriter(self.dumps)

    def loads(self, path: str | os.PathLike) -> None:
        """Restore a copy written by :meth:`dumps` into this buffer's ``scratch_dir``."""
        self.ring.load(path)
