"""``optim.cudagraphs``: replay the device half of an update (loss, backward, clip, optimizer step) from one CUDA graph.

Small RL networks leave a GPU waiting on kernel launches (a few microseconds each, hundreds per update); a CUDA
graph launches them all at once, which is where TorchRL's sota recipes and LeanRL get their GPU speed. The capture
follows torch's whole-network recipe (``torch.cuda.graphs``): warm up on a side stream, capture once, then copy
each sample into the graph's input buffers and replay. tensordict's ``CudaGraphModule`` is not used: it calls
``torch.cuda.synchronize()`` before every replay (tensordict 0.14), a host wait per update.

What the graph replays must be device work with fixed shapes and no Python state that changes between calls:
``Updater.apply`` and the loss, not ``Updater.advance`` (counters, target updates), which runs eagerly after each
replay; the optimizer needs ``capturable=True`` and a tensor learning rate (:func:`graph_lr`), so that a learning
rate schedule reaches the captured step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase

from tdrl.utils.errors import UserError

__all__ = ["CudaGraphUpdate", "graph_adam", "graph_lr", "static_like", "update_step"]

WARMUP_CALLS = 3
"""Eager calls before the capture: they create the optimizer state, cuBLAS workspaces and autograd's buffers."""


def graph_lr(lr: float, device: torch.device, cudagraphs: bool) -> float | torch.Tensor:
    """The optimizer's ``lr``: a tensor on ``device`` under CUDA graphs (a float would be baked into the graph)."""
    return torch.tensor(float(lr), device=device) if cudagraphs else lr


def graph_adam(params: Any, *, lr: float, device: torch.device, cudagraphs: bool, **kwargs: Any) -> torch.optim.Adam:
    """The recipes' Adam: fused (a non-finite update is skipped on the device: :mod:`tdrl.objectives.update`) and,
    under ``cudagraphs``, capturable, with every learning rate (``lr`` and the ``"lr"`` of any param group) a
    tensor on ``device`` (:func:`graph_lr`)."""
    groups = list(params)
    if groups and isinstance(groups[0], dict):
        groups = [{**group, "lr": graph_lr(group["lr"], device, cudagraphs)} if "lr" in group else group
                  for group in groups]
    return torch.optim.Adam(groups, lr=graph_lr(lr, device, cudagraphs), fused=True, capturable=cudagraphs,
                            **kwargs)


def update_step(fn: Callable[[TensorDictBase], TensorDictBase], *, cudagraphs: bool, device: torch.device,
                key: str = "optim.cudagraphs") -> Callable[[TensorDictBase], TensorDictBase]:
    """``fn`` itself, or a :class:`CudaGraphUpdate` of it when ``cudagraphs``; raises :class:`UserError` naming
    ``key`` when ``cudagraphs`` is asked for on a device that is not CUDA (there is nothing to capture)."""
    if not cudagraphs:
        return fn
    if torch.device(device).type != "cuda":
        raise UserError(f"{key}=true replays CUDA graphs, but run.device={str(device)!r}; set run.device=cuda or "
                        f"{key}=false")
    return CudaGraphUpdate(fn, device=torch.device(device))


def static_like(sample: TensorDictBase) -> TensorDictBase:
    """A copy of ``sample`` in fresh buffers with its keys, shapes, dtypes and strides: replay samples are views of
    grouped storage, and a compiled loss guards on strides, so a contiguous copy would make it compile again (inside
    the capture, where compiling cannot run). A broadcast leaf (a zero stride) is copied contiguous."""
    def buffer(t: torch.Tensor) -> torch.Tensor:
        if any(stride == 0 and size > 1 for size, stride in zip(t.shape, t.stride(), strict=True)):
            return t.clone(memory_format=torch.contiguous_format)
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
    return sample.apply(buffer)


class CudaGraphUpdate:
    """``fn(sample) -> metrics``, run eagerly on a side stream for ``warmup`` calls, then captured into a CUDA graph
    and replayed: each call copies ``sample`` (same keys, shapes and device every call) into the graph's inputs,
    replays, and returns a copy of the outputs (the graph overwrites them at the next replay).

    The warm-up calls already read the graph's input buffers (:func:`static_like`), so a compiled ``fn`` meets in
    the capture exactly the tensors it was compiled for; the capture runs under torch.compile's
    ``fail_on_recompile`` stance, so a recompile there is named instead of failing as a CUDA error. Each call gets
    its own TensorDict structure over those buffers: keys ``fn`` writes into it do not carry over.

    Args:
        fn: device work only (see the module docstring); the capture call runs it once without executing it.
        device: the CUDA device of the samples and the model.
        warmup: eager calls before the capture (each is a real update).
    """

    def __init__(self, fn: Callable[[TensorDictBase], TensorDictBase], *, device: torch.device,
                 warmup: int = WARMUP_CALLS) -> None:
        if warmup < 1:
            raise ValueError(f"warmup must be >= 1 call, got {warmup}")
        self.fn, self.device, self.warmup = fn, device, int(warmup)
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: TensorDictBase | None = None  # the buffers the warm-up calls and the graph read
        self.outputs: TensorDictBase | None = None

    def __call__(self, sample: TensorDictBase) -> TensorDictBase:
        self.calls += 1
        if self.static is None:
            self.static = static_like(sample)
        else:  # device-to-device copies into the buffers the graph reads
            self.static.update_(sample)
        if self.graph is not None:
            self.graph.replay()
            assert self.outputs is not None  # captured with the graph
            return self.outputs.clone()
        if self.calls <= self.warmup:
            current = torch.cuda.current_stream(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(current)
            with torch.cuda.stream(side):
                out = self.fn(self.static.clone(recurse=False))
            current.wait_stream(side)
            return out
        self.graph = torch.cuda.CUDAGraph()
        with torch.compiler.set_stance("fail_on_recompile"), torch.cuda.graph(self.graph):
            self.outputs = self.fn(self.static.clone(recurse=False))
        self.graph.replay()  # the capture recorded this call's update without running it
        return self.outputs.clone()
