"""Keeping data-parallel replicas identical: gradient averaging, start-up broadcast, bitwise digests.

Why gradients are all-reduced by hooks rather than ``DistributedDataParallel``: TorchRL loss modules call their
networks functionally (``params.to_module(net)``), bypassing a DDP wrapper's ``forward``, which DDP needs to
prepare its reducer. :class:`GradientAllReduce` hooks the parameters themselves: it notes every gradient
accumulated during a backward pass and, when the pass ends (autograd's final callback, the point where DDP
finishes its own reduction), all-reduces them in one flat buffer per dtype and device and divides by the world
size. The recipe's :class:`~tdrl.objectives.update.Updater` then checks and clips the *averaged* gradient, exactly
as a single process would clip the gradient of the whole batch. Every rank receives the same reduced bytes and
runs the same deterministic optimizer step, so the replicas stay bitwise equal (:func:`replica_digest`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from tdrl.utils.distributed import is_distributed, rank, world_size

__all__ = ["GradientAllReduce", "ReplicaDivergenceError", "broadcast_from_main", "broadcast_module_state",
           "gather_to_main", "replica_digest",
           "tensor_digest"]


_T = TypeVar("_T", bound=torch.Tensor)


class ReplicaDivergenceError(RuntimeError):
    """The replicated modules differ across ranks (a step was not averaged, or a rank changed them alone)."""


def _unique(tensors: Iterable[_T]) -> list[_T]:
    """Each tensor once (modules may share parameters, e.g. a loss holding the actor and a critic using it)."""
    return list({id(t): t for t in tensors}.values())


def _unique_params(modules: Iterable[nn.Module]) -> list[nn.Parameter]:
    return _unique(p for m in modules for p in m.parameters())


def _unique_buffers(modules: Iterable[nn.Module]) -> list[torch.Tensor]:
    return _unique(b for m in modules for b in m.buffers())


def _by_dtype_device(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    return list(groups.values())


def _flat_collective(tensors: Sequence[torch.Tensor], op: Callable[[torch.Tensor], None]) -> None:
    """Run ``op`` in place on one flat buffer per (dtype, device) holding ``tensors``, then copy back."""
    for group in _by_dtype_device(tensors):
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        op(flat)
        offset = 0
        with torch.no_grad():
            for t in group:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n


class GradientAllReduce:
    """Average the gradients of ``modules``' parameters (e.g. the TorchRL loss module, which holds actor, critic
    and any trainable temperature) over all ranks at the end of every backward pass, in a fixed parameter order
    (see the module docstring). All ranks must run the same backward passes over the same parameters (they do when
    they run the same code on same-shaped batches); gradients accumulated over several passes before one step are
    averaged pass by pass, which gives the same mean.
    """

    def __init__(self, modules: Iterable[nn.Module]) -> None:
        self.params = [p for p in _unique_params(modules) if p.requires_grad]
        if not self.params:
            raise ValueError("GradientAllReduce: the modules have no trainable parameters")
        self._order = {id(p): i for i, p in enumerate(self.params)}
        self._touched: set[int] = set()
        self._expected: set[int] | None = None  # the parameters this backward pass reaches, once all are computed
        self.reductions = 0
        self.reduce_s = 0.0  # wall time in the all-reduce, including waiting for the slowest rank
        # A backward pass ends for these parameters when the last one it reaches has accumulated its gradient: the
        # multi-grad hook says which ones it reaches (it fires before the last accumulation), the post-accumulate
        # hooks say which ones are done.
        self._handles = [p.register_post_accumulate_grad_hook(self._on_accumulated) for p in self.params]
        self._handles.append(torch.autograd.graph.register_multi_grad_hook(self.params, self._on_computed, mode="all"))

    def _on_computed(self, grads: Sequence[torch.Tensor | None]) -> None:
        self._expected = {i for i, grad in enumerate(grads) if grad is not None}
        self._reduce_when_done()

    def _on_accumulated(self, param: torch.Tensor) -> None:
        self._touched.add(self._order[id(param)])
        self._reduce_when_done()

    def _reduce_when_done(self) -> None:
        if self._expected is None or not self._expected <= self._touched:
            return
        touched = sorted(self._expected)
        self._touched.clear()
        self._expected = None
        if not is_distributed() or world_size() == 1:
            return
        grads = [grad for grad in (self.params[i].grad for i in touched) if grad is not None]
        n = world_size()

        def all_reduce_mean(flat: torch.Tensor) -> None:
            dist.all_reduce(flat)
            flat.div_(n)

        start = time.perf_counter()
        _flat_collective(grads, all_reduce_mean)
        self.reduce_s += time.perf_counter() - start
        self.reductions += 1

    def remove(self) -> None:
        """Unregister the hooks (the modules go back to plain single-process gradients)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def broadcast_module_state(modules: Iterable[nn.Module], *, buffers: bool = True, params: bool = True) -> None:
    """Copy rank 0's parameters (and buffers) into every rank's modules, in place (DDP's start-up sync)."""
    if not is_distributed() or world_size() == 1:
        return
    modules = list(modules)
    tensors: list[torch.Tensor] = []
    if params:
        tensors += [p.data for p in _unique_params(modules)]
    if buffers:
        tensors += _unique_buffers(modules)
    if tensors:
        _flat_collective(tensors, lambda flat: dist.broadcast(flat, src=0))


def replica_digest(modules: Iterable[nn.Module], *, buffers: bool = False) -> str:
    """Hash of the exact bytes of the modules' parameters (and buffers): equal digests mean bitwise-equal models."""
    modules = list(modules)
    return tensor_digest([p.data for p in _unique_params(modules)] + (_unique_buffers(modules) if buffers else []))


def tensor_digest(tensors: Iterable[torch.Tensor]) -> str:
    """Hash of the exact bytes of ``tensors``."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def gather_to_main(obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0 (``None`` elsewhere)."""
    if not is_distributed():
        return [obj]
    out = [None] * world_size() if rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
