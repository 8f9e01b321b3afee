"""Hardware slots: how many runs go at once on this machine, and which CPU cores and GPUs each one gets.

A run asks for ``cpus_per_run`` cores and ``gpus_per_run`` GPUs and the machine is cut into equal slots (rlpyt's
affinity codes, simplified). The launcher pins a run to its slot's cores, so ``os.sched_getaffinity(0)`` *is*
the slot inside the run (and in the workers it starts), and sets the thread and device variables of
:meth:`Slot.env`: ``CUDA_VISIBLE_DEVICES`` is empty for CPU-only slots, so a CPU run never grabs GPU 0.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Slot", "SlotError", "current_slot_cpus", "format_cpus", "make_slots", "parse_cpus"]


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
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        try:
            cpus.update(range(int(first), int(last or first) + 1))
        except ValueError:
            raise SlotError(f"cannot read CPU list {text!r} (expected e.g. '0-3,6')") from None
    return tuple(sorted(cpus))


def format_cpus(cpus: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"``."""
    ranges: list[list[int]] = []
    for cpu in sorted(cpus):
        if ranges and cpu == ranges[-1][-1] + 1:
            ranges[-1].append(cpu)
        else:
            ranges.append([cpu])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in ranges)


def current_slot_cpus() -> tuple[int, ...]:
    """The cores this process may use, to place worker processes inside the run's slot: the slot's
    (``TDRL_SLOT_CPUS``, set by the launchers) or else the affinity mask."""
    text = os.environ.get("TDRL_SLOT_CPUS", "")
    return parse_cpus(text) if text else tuple(sorted(os.sched_getaffinity(0)))


def _detect_gpus() -> int:
    """Number of CUDA devices visible to this process (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def make_slots(
    cpus_per_run: int | None = None, gpus_per_run: int = 0, runs_per_gpu: int = 1,
    cpus: tuple[int, ...] | list[int] | None = None, n_gpus: int | None = None, max_slots: int | None = None,
) -> list[Slot]:
    """Cut the machine into equal slots, one run per slot at a time.

    Args:
        cpus_per_run: cores per run. ``None``: 1 without GPUs; with GPUs, the cores split evenly over the GPU
            slots (rlpyt: an 8-GPU, 40-core machine gives each 1-GPU run 5 cores).
        runs_per_gpu: runs sharing one GPU (rlpyt's ``contexts_per_gpu``); only with ``gpus_per_run=1``.
        cpus: the core ids to use; default: this process's affinity mask.
        n_gpus: GPUs to use; default: :func:`_detect_gpus` when ``gpus_per_run > 0``.

    Raises:
        SlotError: the request does not fit the machine (more cores or GPUs per run than there are, ...).
    """
    cpus = tuple(sorted(set(cpus))) if cpus is not None else tuple(sorted(os.sched_getaffinity(0)))
    have = f"this machine has {len(cpus)} CPU cores ({format_cpus(cpus)})"
    _check_request(cpus, cpus_per_run, gpus_per_run, runs_per_gpu, have)
    if gpus_per_run == 0:
        per_run = cpus_per_run or 1
        n_slots = len(cpus) // per_run
        gpu_sets: list[tuple[int, ...]] = [() for _ in range(n_slots)]
    else:
        per_run, gpu_sets = _gpu_slots(len(cpus), cpus_per_run, gpus_per_run, runs_per_gpu, n_gpus, have)
        n_slots = min(len(gpu_sets), len(cpus) // per_run)
    if max_slots is not None:
        if max_slots < 1:
            raise SlotError(f"max_slots={max_slots}: need at least 1")
        n_slots = min(n_slots, max_slots)
    return [Slot(index=i, cpus=cpus[i * per_run : (i + 1) * per_run], gpus=gpu_sets[i]) for i in range(n_slots)]


def _check_request(cpus: tuple[int, ...], cpus_per_run: int | None, gpus_per_run: int, runs_per_gpu: int,
        have: str) -> None:
    """Raise :class:`SlotError` for a request no machine (or not this one's ``cpus``) can satisfy."""
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


def _gpu_slots(n_cpus: int, cpus_per_run: int | None, gpus_per_run: int, runs_per_gpu: int, n_gpus: int | None,
        have: str) -> tuple[int, list[tuple[int, ...]]]:
    """The cores per run and the GPU set of each GPU slot (``runs_per_gpu`` slots share a GPU set)."""
    n_gpus = _detect_gpus() if n_gpus is None else n_gpus
    if gpus_per_run > n_gpus:
        raise SlotError(f"gpus_per_run={gpus_per_run} but this machine has {n_gpus} GPUs")
    gpu_sets = [
        tuple(range(g * gpus_per_run, (g + 1) * gpus_per_run))
        for g in range(n_gpus // gpus_per_run)
        for _ in range(runs_per_gpu)
    ]
    per_run = cpus_per_run or n_cpus // len(gpu_sets)
    if per_run < 1:
        raise SlotError(
            f"{len(gpu_sets)} GPU slots ({n_gpus} GPUs, gpus_per_run={gpus_per_run}, "
            f"runs_per_gpu={runs_per_gpu}) need at least one core each, but {have}"
        )
    return per_run, gpu_sets
