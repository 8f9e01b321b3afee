"""Samples on the learner's device: staged through pinned memory, or gathered from a copy of the data kept there.

:func:`deliver` moves a host sample to the device without blocking the host (pinned memory, ``non_blocking``).
:class:`DeviceCopy` keeps a copy of a transition replay's stored data on the device, so samples are gathered there:
for small observations, gathering a sample on the host and copying it to a GPU costs about as much as the update
that uses it, while on the GPU it is a few ``index_select`` kernels (TorchRL's sota recipes keep their replay on the
GPU for this reason). The memmapped files stay the replay's data (checkpoints, dumps); the copy follows them: before
each sample the steps written since the previous one are copied over (two slices when the ring wrapped). It holds
the packed groups of a :class:`~tdrl.replay.buffer.TransitionReplayBuffer` (a frame stack's frames:
:class:`~tdrl.replay.frames.FrameCopy`), and needs the writes to happen in this process, between samples (the sync
trainer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from tdrl.replay.schema import ReplayError
from tdrl.utils.keys import WEIGHT_KEY

__all__ = ["DeviceCopy", "deliver", "fits_on_device", "sample_device", "staged", "views"]


def views(groups: dict[str, list], fields: Mapping[str, torch.Tensor]) -> tuple[dict, dict]:
    """``(key -> [B, T_cap, *shape], group or key -> [B * T_cap, ...])`` views of the packed group ``fields``."""
    per_key, flat = {}, {}
    for group, members in groups.items():
        whole = fields[group]
        flat[group] = whole.flatten(0, 1)
        for key, offset, size, shape in members:
            per_key[key] = whole[..., offset : offset + size].view(*whole.shape[:2], *shape)
            flat[key] = per_key[key].flatten(0, 1)
    return per_key, flat


def sample_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as samples are compared against it (``cuda`` becomes ``cuda:<current>``); ``None`` stays."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def staged(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` (host) on ``device``; to a GPU through pinned memory, without blocking the host."""
    if tensor.device == device:
        return tensor
    if device.type != "cuda":
        return tensor.to(device)
    return (tensor if tensor.is_pinned() else tensor.pin_memory()).to(device, non_blocking=True)


def deliver(sample: TensorDictBase, index: np.ndarray, weights: np.ndarray | None,
            device: torch.device | None) -> TensorDictBase:
    """``sample`` with its leaves (``index``) and importance weights (``priority_weight``, prioritized), and the
    entries still on the host moved to ``device`` (``None`` or the CPU: left where they are)."""
    sample.set("index", torch.from_numpy(index))
    if weights is not None:
        sample.set(WEIGHT_KEY, torch.from_numpy(weights))
    if device is None or device.type == "cpu":
        return sample
    return sample.apply(lambda t: staged(t, device))


AUTO_FRACTION = 0.25
"""``copy_on_device=None`` copies when the stored data takes at most this fraction of the GPU's memory."""


def fits_on_device(ring: Any, device: torch.device) -> bool:
    """Whether ``ring``'s packed data takes at most :data:`AUTO_FRACTION` of ``device``'s memory (CUDA only)."""
    if device.type != "cuda":
        return False
    nbytes = sum(field.nbytes for field in ring.store.fields.values())  # packed groups and codec fields (frames)
    return nbytes <= AUTO_FRACTION * torch.cuda.get_device_properties(device).total_memory


class DeviceCopy:
    """``flat``: group or key -> ``[B * T_cap, ...]`` view on ``device``, as :attr:`StreamRing.flat`, current after
    :meth:`refresh`."""

    def __init__(self, ring: Any, device: torch.device) -> None:
        self.device = device
        self.groups = {group: torch.zeros(ring.store.fields[group].shape, dtype=ring.store.fields[group].dtype,
                                          device=device) for group in ring.groups}
        self.flat = views(ring.groups, self.groups)[1]
        self.copied = 0  # absolute steps copied (the ring's write_done at the last refresh)

    def refresh(self, ring: Any) -> None:
        """Copy the steps written since the last refresh (all of them after a load to fewer steps)."""
        done, time_capacity = ring.write_done, ring.time_capacity
        if ring.write_started != done:
            raise ReplayError("a replay copied to the device needs its writes in this process, between samples "
                              "(the sync trainer); another process is writing")
        if done < self.copied:
            self.copied = 0
        lo = max(self.copied, done - time_capacity)
        if lo >= done:
            return
        start, stop = lo % time_capacity, done % time_capacity or time_capacity
        spans = [(start, stop)] if start < stop else [(start, time_capacity), (0, stop)]
        for group, copy in self.groups.items():
            source = ring.store.fields[group]
            for a, b in spans:
                copy[:, a:b].copy_(source[:, a:b], non_blocking=True)
        self.copied = done
