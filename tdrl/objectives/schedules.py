"""Linear schedules for learning rates, PPO's ratio clip, epsilon-greedy and PER's beta.

A schedule is a pure function of a counter (iteration, env frames or gradient updates), so it has no state to
checkpoint: the counter is what the checkpoint restores. E.g. rlpyt's PPO ``linear_lr_schedule`` is
``updater.lr = LinearSchedule(lr, 0.0, duration=n_itr)(itr)``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LinearSchedule"]


@dataclass(frozen=True)
class LinearSchedule:
    """``start`` until ``delay``, then linear to ``end`` over ``duration`` units, then ``end`` forever.

    Args:
        start: value at ``t <= delay``.
        end: value at ``t >= delay + duration``.
        duration: length of the ramp in the caller's unit (iterations, frames or updates); 0 jumps to ``end``
            at ``delay``.
        delay: units to hold ``start`` before the ramp begins.
    """

    start: float
    end: float
    duration: int
    delay: int = 0

    def __post_init__(self) -> None:
        if self.duration < 0 or self.delay < 0:
            raise ValueError(f"duration and delay must be >= 0, got {self.duration}, {self.delay}")

    def __call__(self, t: int | float) -> float:
        if t <= self.delay:
            return float(self.start) if self.duration > 0 or t < self.delay else float(self.end)
        if self.duration == 0 or t >= self.delay + self.duration:
            return float(self.end)
        frac = (t - self.delay) / self.duration
        return float(self.start + frac * (self.end - self.start))
