"""Seeding and RNG capture for reproducible runs and exact resume.

:func:`seed_everything` seeds python, numpy's global RNG and torch (rlpyt's ``set_seed``); :func:`rng_state` and
:func:`set_rng_state` capture and restore those generators, so a resumed run draws the numbers it would have drawn
without the interruption. Per-environment seeds belong to the collector; :func:`spawn_seeds` derives independent
seeds for workers and environments from one run seed.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["rng_state", "seed_everything", "set_rng_state", "spawn_seeds"]


def seed_everything(seed: int, *, deterministic: bool = False) -> None:
    """Seed python ``random``, numpy's global RNG and torch on every device with ``seed`` (an int).

    ``deterministic`` also asks torch for deterministic kernels: CPU training is already deterministic for the ops
    tdrl uses, GPU training is not without it.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy's legacy seeding takes 32-bit seeds only
    torch.manual_seed(seed)  # seeds CUDA devices too
    if deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def spawn_seeds(seed: int, n: int) -> list[int]:
    """``n`` independent 32-bit seeds derived from ``seed`` (numpy ``SeedSequence``), e.g. one per env worker.

    Consecutive integers (``seed, seed+1, ...``) give correlated streams for some generators; a seed
    sequence does not, and the result depends only on ``(seed, n)``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    children = np.random.SeedSequence(seed).spawn(n)
    return [int(child.generate_state(1)[0]) for child in children]


def rng_state() -> dict[str, Any]:
    """Capture python, numpy and torch (CPU and CUDA) RNG states as plain values and tensors (numpy's key as a
    tensor), so they save with ``torch.save`` and load with ``torch.load(weights_only=True)``."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)), "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore RNG states captured by :func:`rng_state` (``KeyError`` when ``python``, ``numpy`` or ``torch`` is
    missing).

    CUDA states are restored when this process sees at least as many devices as were captured; resuming a GPU run
    on a CPU-only machine restores the CPU generators only.
    """
    missing = [k for k in ("python", "numpy", "torch") if k not in state]
    if missing:
        raise KeyError(f"RNG state lacks {missing}; expected a dict from tdrl.utils.seeding.rng_state()")
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": np_state["bit_generator"],
            "state": {"key": np_state["key"].numpy().astype(np.uint32), "pos": np_state["pos"]},
            "has_gauss": np_state["has_gauss"], "gauss": np_state["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() >= len(cuda):
        torch.cuda.set_rng_state_all(cuda)


def numpy_generator(seed: int | None) -> np.random.Generator:
    """A numpy ``Generator`` seeded with ``seed`` or, for ``None``, with a draw from torch's global generator: a
    script that calls ``torch.manual_seed`` (or :func:`seed_everything`) draws the same samples on every run."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    return np.random.default_rng(seed)
