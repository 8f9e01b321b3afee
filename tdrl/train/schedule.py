"""When a run does what: its budget, log/evaluation and checkpoint cadence, learning start, replay ratio and early
stop, set once in env frames (:class:`Schedule`) and read by every trainer through its
:class:`~tdrl.train.bookkeeping.Bookkeeper` in collector iterations (:class:`Cadence`). One rule each, so the sync,
async and Ray trainers start learning, log and checkpoint at the same frames on the same config.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Cadence", "Schedule", "iteration_counts", "owed_updates", "updates_per_iteration"]


def iteration_counts(n_steps: int, log_interval_steps: int, frames_per_itr: int) -> tuple[int, int]:
    """``(n_itr, log_interval_itrs)``: rlpyt's ``get_n_itr`` with ``n_itr`` rounded up, so a run trains at least
    ``n_steps`` frames: ``ceil(n_steps / frames_per_itr)`` iterations, then on to the next log boundary;
    ``log_interval_itrs`` is ``log_interval_steps`` rounded down to whole iterations, at least one and at most the
    run (rlpyt rounds ``n_itr`` down first: 1000 steps of 256-frame iterations logged every 1000 trained 768 frames;
    a log interval longer than the run would otherwise stretch the run to it: 3,000 frames logged every 1e8 ran 1e8)."""
    if frames_per_itr <= 0:
        raise ValueError(f"frames_per_itr must be positive, got {frames_per_itr}")
    if n_steps <= 0 or log_interval_steps <= 0:
        raise ValueError(f"n_steps and log_interval_steps must be positive, got {n_steps}, {log_interval_steps}")
    n_itr = -(-int(n_steps) // frames_per_itr)  # ceil
    log_interval_itrs = min(max(int(log_interval_steps) // frames_per_itr, 1), n_itr)
    if n_itr % log_interval_itrs:
        n_itr += log_interval_itrs - n_itr % log_interval_itrs
    return n_itr, log_interval_itrs


def updates_per_iteration(replay_ratio: float, frames_per_itr: int, batch_size: int) -> int:
    """rlpyt's off-policy update count: ``max(1, round(replay_ratio * frames_per_itr / batch_size))``;
    ``replay_ratio`` is data consumed by the optimiser over data collected (8: each transition sampled ~8 times)."""
    if replay_ratio <= 0 or batch_size <= 0:
        raise ValueError(f"replay_ratio and batch_size must be positive, got {replay_ratio}, {batch_size}")
    return max(1, round(replay_ratio * frames_per_itr / batch_size))


def owed_updates(*, replay_ratio: float, batch_size: int, write_count: int, samples_drawn: int,
                 learn_start_frames: int, ready: int) -> int:
    """Gradient updates an optimizer fed by other processes (async, Ray) may do now without the replay ratio
    exceeding ``replay_ratio``, counted from :attr:`Cadence.learn_start_frames`; 0 while fewer than ``batch_size``
    transitions are ready. Both sides of a throttle call it, so they cannot disagree (which would deadlock a
    collector waiting for the optimizer)."""
    if write_count <= learn_start_frames or ready < batch_size:
        return 0
    allowed = replay_ratio * (write_count - learn_start_frames) - samples_drawn
    return max(0, math.floor(allowed / batch_size + 1e-9))


@dataclass(frozen=True)
class Schedule:
    """A run's schedule in env frames, all ranks (what a recipe's config sets; :meth:`from_config`).

    Args:
        n_steps: frames to train at least (rounded up to whole log intervals: :func:`iteration_counts`).
        log_interval_steps: frames between log rows and evaluations.
        checkpoint_interval_steps: frames between checkpoints; 0: at every log row.
        min_steps_learn: frames collected before the first update (rounded down to whole iterations).
        replay_ratio, batch_size: off-policy: samples trained on per frame collected, and per update (per rank);
            ``None`` on-policy (one update call per batch).
        stop_return: stop early once the evaluation (else online) mean return reaches it (benchmarks).
    """

    n_steps: int
    log_interval_steps: int
    checkpoint_interval_steps: int = 0
    min_steps_learn: int = 0
    replay_ratio: float | None = None
    batch_size: int | None = None
    stop_return: float | None = None

    def __post_init__(self) -> None:
        if (self.replay_ratio is None) != (self.batch_size is None):
            raise ValueError("replay_ratio and batch_size go together (updates per iteration need both)")

    @classmethod
    def from_config(cls, cfg: Any, *, on_policy: bool, **overrides: Any) -> Schedule:
        """The schedule of a recipe's whole config: ``collector.total_frames``, ``logger.log_interval_steps``,
        ``checkpoint.interval_steps``, ``stop_return`` and, off-policy, ``optim.replay_ratio``, ``optim.batch_size``
        and ``optim.min_steps_learn``; ``overrides`` replace any of them (R2D1's batch counts sequence steps)."""
        paths = {"n_steps": "collector.total_frames", "log_interval_steps": "logger.log_interval_steps",
                 "checkpoint_interval_steps": "checkpoint.interval_steps", "stop_return": "stop_return"}
        if not on_policy:
            paths.update(replay_ratio="optim.replay_ratio", batch_size="optim.batch_size",
                         min_steps_learn="optim.min_steps_learn")
        fields = {name: functools.reduce(getattr, path.split("."), cfg) for name, path in paths.items()
                  if name not in overrides}  # an override may stand for a key the config lacks
        return cls(**fields, **overrides)

    def cadence(self, frames_per_itr: int) -> Cadence:
        """This schedule in iterations of ``frames_per_itr`` frames (all ranks)."""
        n_itr, log_itrs = iteration_counts(self.n_steps, self.log_interval_steps, frames_per_itr)
        ckpt_itrs = int(self.checkpoint_interval_steps) // frames_per_itr
        return Cadence(frames_per_itr=frames_per_itr, n_itr=n_itr, log_interval_itrs=log_itrs,
                       checkpoint_interval_itrs=max(ckpt_itrs, 1) if self.checkpoint_interval_steps else log_itrs,
                       min_itr_learn=int(self.min_steps_learn) // frames_per_itr)


@dataclass(frozen=True)
class Cadence:
    """A :class:`Schedule` in collector iterations. Iteration ``i`` (0-based) has collected ``(i + 1) *
    frames_per_itr`` frames; the first update comes in iteration ``min_itr_learn``, on the data of
    ``learn_start_frames`` plus one batch: the sync trainer's ``updates_due``, and the async and Ray throttles'
    :func:`owed_updates`, count from there."""

    frames_per_itr: int
    n_itr: int
    log_interval_itrs: int
    checkpoint_interval_itrs: int
    min_itr_learn: int

    @property
    def learn_start_frames(self) -> int:
        """Frames collected before the first update: ``min_steps_learn`` rounded down to whole iterations."""
        return self.min_itr_learn * self.frames_per_itr

    def learning(self, itr: int) -> bool:
        """Whether iteration ``itr`` (0-based, inside the loop body) updates."""
        return itr >= self.min_itr_learn
