"""Linear schedules for learning rates, PPO's ratio clip, epsilon-greedy and PER's beta.

A schedule is a pure function of a counter, so it has no state to checkpoint: the counter (trainer iteration,
env frames or gradient updates, whichever unit the recipe picks) is what the checkpoint restores. rlpyt's
schedules map onto it directly:

* PPO ``linear_lr_schedule``: LR and ratio clip decay to 0 over the run, stepped once per iteration::

      lr_at = LinearSchedule(start=1e-3, end=0.0, duration=trainer.n_itr)
      updater.lr = lr_at(trainer.itr)

* DQN epsilon: ``eps_init`` → ``eps_final`` between ``eps_itr_min`` and ``eps_itr_max``::

      eps_at = LinearSchedule(start=1.0, end=0.01, duration=eps_itr_max - eps_itr_min, delay=eps_itr_min)

* PER beta: ``pri_beta_init`` → ``pri_beta_final`` over ``pri_beta_steps`` env steps:
  ``LinearSchedule(0.4, 1.0, duration=pri_beta_steps)(trainer.frames)``.
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

    Examples:
        >>> s = LinearSchedule(1.0, 0.0, duration=10)
        >>> s(0), s(5), s(10), s(20)
        (1.0, 0.5, 0.0, 0.0)
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
