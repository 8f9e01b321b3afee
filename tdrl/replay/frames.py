"""Frame de-duplication for stacked image observations (Atari): each frame is stored once.

A stack ``[F, *frame]`` (oldest to newest) shares ``F - 1`` frames with the previous step's, so storing stacks costs
``F`` times the memory (``2F`` with the next observation). :class:`FrameStack` keeps one ring of single frames per
stream and rebuilds both stacks when sampling. Every step writes the newest frame of its ``observation``; a step that
ends an episode also writes the final frame of its ``("next", "observation")`` right after, so a step's next stack
always ends one frame later. Per step the ring stores the position of its newest frame and how many history frames
belong to its episode (episode starts from ``is_init``, else the previous ``done``). Frames before an episode start
are padding: zeros (``padding="zero"``, rlpyt) or the episode's first frame (``"reset"``, as gymnasium's
``FrameStackObservation`` and ``tdrl.envs.atari.AtariFrames`` stack); the first episode starts are checked against it.

Memory per transition is ``1 + slack`` frames; ``slack`` (default 1/16) is room for the final frames of episodes
ending inside the buffer, i.e. episodes of at least 16 steps on average. Shorter ones make :meth:`prepare` raise
before anything is written (raise ``slack``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

from tdrl.replay.device import staged
from tdrl.replay.schema import BatchSchema, ReplayError, as_key, key_name

__all__ = ["FrameCopy", "FrameStack"]

_PIXELS, _POS, _OFFSET, _WRITTEN = "frames.pixels", "frames.pos", "frames.offset", "frames.written"


class FrameStack:
    """Codec storing ``key``/``next_key`` stacks ``[B, T, F, *frame]`` as single frames.

    Args:
        n_frames: stack depth ``F``.
        key: observation key.
        next_key: next-observation key.
        padding: ``"zero"`` or ``"reset"`` (see module docstring).
        slack: extra frame slots per stream, as a fraction of ``T_cap``, for final frames of finished episodes.
    """

    def __init__(self, n_frames: int = 4, key: NestedKey = "observation",
                 next_key: NestedKey = ("next", "observation"), padding: str = "zero", slack: float = 1 / 16) -> None:
        if n_frames < 1 or padding not in ("zero", "reset") or slack <= 0:
            raise ValueError(f"need n_frames >= 1, padding 'zero' or 'reset' and slack > 0, got {n_frames}, "
                             f"{padding!r}, {slack}")
        self.n_frames = int(n_frames)
        self.key = as_key(key)
        self.next_key = as_key(next_key)
        self.padding = padding
        self.slack = float(slack)
        self._checked_padding = False

    @property
    def keys(self) -> list[tuple[str, ...]]:
        return [self.key, self.next_key]

    def fields(self, batch: TensorDictBase, num_streams: int, time_capacity: int) -> dict[str, Any]:
        obs = batch.get(self.key, None)
        if obs is None or obs.ndim < 3 or obs.shape[2] != self.n_frames:
            shape = None if obs is None else tuple(obs.shape)
            raise ReplayError(f"frame stacking needs key {key_name(self.key)!r} as stacks [B, T, {self.n_frames}, "
                              f"*frame] (oldest to newest), got shape {shape}")
        frame_capacity = time_capacity + max(1, math.ceil(time_capacity * self.slack))
        return {  # name: (shape, dtype, cursor): frames go by each stream's frame count, the rest by ring step
            _PIXELS: ((num_streams, frame_capacity, *obs.shape[3:]), obs.dtype, _WRITTEN),
            _POS: ((num_streams, time_capacity), torch.int64, 1),
            _OFFSET: ((num_streams, time_capacity), torch.uint8, 1),
            _WRITTEN: ((num_streams, 1), torch.int64, None),
        }

    def prepare(self, ring: Any, batch: TensorDictBase, steps: int) -> dict[str, Any]:
        """Validate the stacks and compute what :meth:`write` stores; raises before anything is written."""
        pixels = ring.field(_PIXELS)
        schema = BatchSchema({key: (pixels.dtype, (self.n_frames, *pixels.shape[2:])) for key in self.keys}, False)
        obs, next_obs = schema.check(batch, torch.Size([ring.num_streams, steps])).values()
        B = ring.num_streams
        done = batch.get(("next", "done"), None)
        if done is None:
            raise ReplayError("frame stacking needs ('next', 'done') to find episode boundaries")
        done = done.reshape(B, steps).cpu().numpy()
        start = self._episode_starts(ring, batch, done, steps)
        offset = self._offsets(ring, start, steps)
        if not self._checked_padding:
            self._check_padding(obs, start)
        # frame positions: one per step, plus one after every done step
        written = ring.field(_WRITTEN)[:, 0].numpy().copy()
        per_step = 1 + done.astype(np.int64)
        pos = written[:, None] + np.cumsum(per_step, axis=1) - per_step
        self._check_room(ring, pos, written + per_step.sum(axis=1), steps)
        frames = []
        for b in range(B):
            newest = obs[b, :, -1]
            order = np.argsort(np.concatenate([pos[b] - written[b], pos[b][done[b]] + 1 - written[b]]), kind="stable")
            frames.append(torch.cat([newest, next_obs[b, torch.from_numpy(done[b]), -1]])[torch.from_numpy(order)])
        return {"pos": torch.from_numpy(pos), "offset": torch.from_numpy(offset), "frames": frames,
                "written": written}

    def _episode_starts(self, ring: Any, batch: TensorDictBase, done: np.ndarray, steps: int) -> np.ndarray:
        is_init = batch.get("is_init", None)
        if is_init is not None:
            return is_init.reshape(ring.num_streams, steps).cpu().numpy().astype(bool)
        previous = np.ones((ring.num_streams, 1), dtype=bool)
        write_done = ring.write_done
        if write_done > 0:  # the last done flag already stored, one per stream
            slot = (write_done - 1) % ring.time_capacity
            previous = ring.fields[("next", "done")][:, slot].reshape(-1, 1).numpy().copy()
        return np.concatenate([previous, done[:, :-1]], axis=1)

    def _offsets(self, ring: Any, start: np.ndarray, steps: int) -> np.ndarray:
        B = ring.num_streams
        cap = self.n_frames - 1
        time = np.arange(steps)
        write_done = ring.write_done
        if write_done > 0:
            prev = ring.field(_OFFSET)[:, (write_done - 1) % ring.time_capacity].numpy().astype(np.int64)
        else:
            prev = np.full(B, -1, dtype=np.int64)  # nothing before: the first step is an episode start anyway
        # steps since the last start inside this batch, else continue from the stored offset
        last_start = np.maximum.accumulate(np.where(start, time[None, :], -1), axis=1)
        since = np.where(last_start >= 0, time[None, :] - last_start, prev[:, None] + 1 + time[None, :])
        return np.minimum(since, cap).astype(np.uint8)

    def _check_padding(self, obs: torch.Tensor, start: np.ndarray) -> None:
        b, t = np.nonzero(start)
        if b.size == 0:
            return
        stacks = obs[torch.from_numpy(b), torch.from_numpy(t)]
        history = stacks[:, :-1]
        expected = torch.zeros_like(history) if self.padding == "zero" else stacks[:, -1:].expand_as(history)
        if not torch.equal(history, expected):
            other = "reset" if self.padding == "zero" else "zero"
            raise ReplayError(f"key {key_name(self.key)!r}: stacks at episode starts are not {self.padding}-padded; "
                              f"build FrameStack(padding={other!r}) to match the environment's frame stacking")
        self._checked_padding = True

    def _check_room(self, ring: Any, pos: np.ndarray, written_after: np.ndarray, steps: int) -> None:
        frame_capacity = ring.field(_PIXELS).shape[1]
        oldest_alive = ring.write_done + steps - ring.time_capacity
        if oldest_alive <= 0:
            return
        if oldest_alive >= ring.write_done:  # the oldest alive step is in this batch
            needed = pos[:, oldest_alive - ring.write_done]
        else:
            needed = ring.field(_POS)[:, oldest_alive % ring.time_capacity].numpy()
        # the oldest sampleable step is n_frames - 1 steps newer, so its whole stack is at or after `needed`
        if np.any(written_after - frame_capacity > needed):
            raise ReplayError(f"frame ring full: episodes are shorter than FrameStack(slack={self.slack}) allows "
                              f"(about {1 / self.slack:.0f} steps on average); raise slack")

    def write(self, ring: Any, prepared: dict[str, Any], start: int) -> None:
        ring.write(ring.field(_POS), prepared["pos"], start)
        ring.write(ring.field(_OFFSET), prepared["offset"], start)
        pixels = ring.field(_PIXELS)
        for b, frames in enumerate(prepared["frames"]):
            ring.write(pixels[b : b + 1], frames.unsqueeze(0), int(prepared["written"][b]))
        ring.field(_WRITTEN)[:, 0] += torch.as_tensor([f.shape[0] for f in prepared["frames"]])

    def _stack(self, ring: Any, index: torch.Tensor, shift: int, pixels: torch.Tensor | None) -> torch.Tensor:
        """Stacks whose newest frame is ``shift`` frames after the newest frame of step ``index`` (host indices),
        gathered from ``pixels`` (a :class:`FrameCopy`'s, on its device) or else the stored frames."""
        if pixels is None:
            pixels = ring.field(_PIXELS)
        frame_capacity = pixels.shape[1]
        flat_pixels = pixels.view(-1, *pixels.shape[2:])
        newest = ring.field(_POS).view(-1)[index] + shift
        real = torch.clamp(ring.field(_OFFSET).view(-1)[index].long() + shift, max=self.n_frames - 1)
        first_real = newest - real
        j = torch.arange(self.n_frames)
        positions = torch.maximum(newest[:, None] - (self.n_frames - 1) + j, first_real[:, None])
        stream = index // ring.time_capacity
        flat = (stream[:, None] * frame_capacity + positions % frame_capacity).reshape(-1)
        stacks = torch.index_select(flat_pixels, 0, staged(flat, pixels.device))
        stacks = stacks.view(index.shape[0], self.n_frames, *pixels.shape[2:])
        if self.padding == "zero":
            is_padding = j[None, :] < (self.n_frames - 1 - real[:, None])
            mask = staged(is_padding, pixels.device).view(*is_padding.shape, *(1,) * (pixels.dim() - 2))
            stacks.masked_fill_(mask, 0)
        return stacks

    def gather(self, ring: Any, index: torch.Tensor, last: torch.Tensor, pixels: torch.Tensor | None = None
               ) -> dict[tuple[str, ...], torch.Tensor]:
        """Rebuilt ``observation`` at the start steps and ``("next", "observation")`` after the window's last step
        (``index`` and ``last`` on the host), from ``pixels`` (a :class:`FrameCopy`'s) when given."""
        return {self.key: self._stack(ring, index, 0, pixels), self.next_key: self._stack(ring, last, 1, pixels)}


class FrameCopy:
    """A copy of a :class:`FrameStack`'s stored frames on ``device``, current after :meth:`refresh`: a replay that
    gathers its samples on a GPU (``copy_on_device``) gathers the stacks there too, so a sample's frames never
    pass through the host. Its stacks' indices are still computed on the host, from the stored positions."""

    def __init__(self, ring: Any, device: torch.device) -> None:
        stored = ring.field(_PIXELS)
        self.pixels = torch.zeros(stored.shape, dtype=stored.dtype, device=device)
        self.copied = np.zeros(stored.shape[0], dtype=np.int64)  # frames copied per stream (absolute counts)

    def refresh(self, ring: Any) -> None:
        """Copy each stream's frames written since the last refresh (all of them after a load to fewer)."""
        stored = ring.field(_PIXELS)
        capacity = stored.shape[1]
        written = ring.field(_WRITTEN)[:, 0].numpy().copy()
        for b, (done, copied) in enumerate(zip(written.tolist(), self.copied.tolist(), strict=True)):
            lo = max(0 if done < copied else copied, done - capacity)
            if lo >= done:
                continue
            start, stop = lo % capacity, done % capacity or capacity
            for a, z in [(start, stop)] if start < stop else [(start, capacity), (0, stop)]:
                self.pixels[b, a:z].copy_(stored[b, a:z], non_blocking=True)
        self.copied = written
