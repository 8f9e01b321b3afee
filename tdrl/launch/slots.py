"""Hardware slots: how many runs go at once on this machine, and which CPU cores and GPUs each one gets.

rlpyt's "affinity code" had a dozen knobs (rlpyt#125); here a run asks for ``cpus_per_run`` cores and
``gpus_per_run`` GPUs and the machine is cut into equal slots (8 cores, ``cpus_per_run=2``: 4 slots). The launcher
pins a run to its slot's cores, so ``os.sched_getaffinity(0)`` *is* the slot inside the run, and sets
``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, ``CUDA_VISIBLE_DEVICES`` (empty for CPU-only slots, so a CPU run never
grabs GPU 0), ``EGL_DEVICE_ID`` and ``TDRL_SLOT*`` for collectors that pin their workers within the slot
(:func:`current_slot_cpus`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Slot", "SlotError", "current_slot_cpus", "detect_gpus", "format_cpus", "make_slots", "parse_cpus"]


class SlotError(ValueError):
    """A resource request this machine cannot satisfy; the message says which and why."""


@dataclass(frozen=True)
class Slot:
    """A share of the machine for one run at a time.

    Attributes:
        index: slot number (0-based).
        cpus: CPU core ids the run is pinned to.
        gpus: GPU indices the run sees (as ``cuda:0..``; empty for CPU-only runs).
    """

    index: int
    cpus: tuple[int, ...]
    gpus: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """Environment variables that make a run (and its collectors and torch threads) follow this slot."""
        threads = str(len(self.cpus))
        gpus = ",".join(str(g) for g in self.gpus)
        out = {
            "TDRL_SLOT": str(self.index), "TDRL_SLOT_CPUS": format_cpus(self.cpus), "TDRL_SLOT_GPUS": gpus,
            "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": gpus,
        }
        if self.gpus:
            out["EGL_DEVICE_ID"] = str(self.gpus[0])
        return out

    def pin(self, pid: int = 0) -> None:
        """Restrict process ``pid`` (0: this one) and the children it starts later to the slot's cores."""
        os.sched_setaffinity(pid, self.cpus)

    def describe(self) -> str:
        """``cpus 0-1`` or ``cpus 0-3 gpu 1``."""
        text = f"cpus {format_cpus(self.cpus)}"
        return text + (f" gpu {','.join(map(str, self.gpus))}" if self.gpus else "")


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0-2,5"`` -> ``(0, 1, 2, 5)`` (the taskset/cpuset list format)."""
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                cpus.extend(range(int(lo), int(hi) + 1))
            else:
                cpus.append(int(part))
        except ValueError:
            raise SlotError(f"cannot read CPU list {text!r} (expected e.g. '0-3,6')") from None
    return tuple(sorted(set(cpus)))


def format_cpus(cpus: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    cpus = sorted(cpus)
    parts, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def current_slot_cpus() -> tuple[int, ...]:
    """The cores this process may use: its slot's (``TDRL_SLOT_CPUS``) or else its affinity mask.

    Collectors call this to place their worker processes inside the run's slot.
    """
    text = os.environ.get("TDRL_SLOT_CPUS", "")
    return parse_cpus(text) if text else tuple(sorted(os.sched_getaffinity(0)))


def detect_gpus() -> int:
    """Number of CUDA devices visible to this process (0 without CUDA or without a GPU build of torch)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def make_slots(
    cpus_per_run: int | None = None, gpus_per_run: int = 0, runs_per_gpu: int = 1,
    cpus: tuple[int, ...] | list[int] | None = None, n_gpus: int | None = None, max_slots: int | None = None,
) -> list[Slot]:
    """Cut the machine into equal slots, one run per slot at a time.

    Args:
        cpus_per_run: cores per run. ``None``: 1 without GPUs; with GPUs, the cores split evenly over the GPU
            slots (rlpyt: an 8-GPU, 40-core machine gives each 1-GPU run 5 cores).
        gpus_per_run: GPUs per run (0 for CPU-only runs).
        runs_per_gpu: runs sharing one GPU (rlpyt's ``contexts_per_gpu``); only with ``gpus_per_run=1``.
        cpus: the core ids to use; default: this process's affinity mask.
        n_gpus: GPUs to use; default: :func:`detect_gpus` when ``gpus_per_run > 0``.
        max_slots: at most this many runs at once.

    Raises:
        SlotError: the request does not fit the machine (more cores or GPUs per run than there are, ...).
    """
    cpus = tuple(sorted(set(cpus))) if cpus is not None else tuple(sorted(os.sched_getaffinity(0)))
    have = f"this machine has {len(cpus)} CPU cores ({format_cpus(cpus)})"
    if not cpus:
        raise SlotError("no CPU cores to run on")
    if cpus_per_run is not None and cpus_per_run < 1:
        raise SlotError(f"cpus_per_run={cpus_per_run}: a run needs at least 1 core")
    if gpus_per_run < 0 or runs_per_gpu < 1:
        raise SlotError(f"gpus_per_run={gpus_per_run}, runs_per_gpu={runs_per_gpu}: need >= 0 and >= 1")
    if runs_per_gpu > 1 and gpus_per_run != 1:
        raise SlotError(f"runs_per_gpu={runs_per_gpu} shares one GPU between runs, so gpus_per_run must be 1")
    if cpus_per_run is not None and cpus_per_run > len(cpus):
        raise SlotError(f"cpus_per_run={cpus_per_run} but {have}")

    if gpus_per_run == 0:
        per_run = cpus_per_run or 1
        n_slots = len(cpus) // per_run
        gpu_sets: list[tuple[int, ...]] = [() for _ in range(n_slots)]
    else:
        n_gpus = detect_gpus() if n_gpus is None else n_gpus
        if gpus_per_run > n_gpus:
            raise SlotError(f"gpus_per_run={gpus_per_run} but this machine has {n_gpus} GPUs")
        gpu_sets = [
            tuple(range(g * gpus_per_run, (g + 1) * gpus_per_run))
            for g in range(n_gpus // gpus_per_run)
            for _ in range(runs_per_gpu)
        ]
        per_run = cpus_per_run or len(cpus) // len(gpu_sets)
        if per_run < 1:
            raise SlotError(
                f"{len(gpu_sets)} GPU slots ({n_gpus} GPUs, gpus_per_run={gpus_per_run}, "
                f"runs_per_gpu={runs_per_gpu}) need at least one core each, but {have}"
            )
        n_slots = min(len(gpu_sets), len(cpus) // per_run)
    if max_slots is not None:
        if max_slots < 1:
            raise SlotError(f"max_slots={max_slots}: need at least 1")
        n_slots = min(n_slots, max_slots)
    return [Slot(index=i, cpus=cpus[i * per_run : (i + 1) * per_run], gpus=gpu_sets[i]) for i in range(n_slots)]
