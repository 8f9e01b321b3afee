"""Evaluation: ``n_envs`` whole greedy episodes per call, on the evaluator's own envs.

Each :meth:`EvalCollector.evaluate` runs one wait-reset batch of ``max_steps`` steps on envs whose time limit is
``max_steps``, so every env plays exactly one whole episode (a step budget shared by all envs would favour short
episodes), under DETERMINISTIC exploration (an ``EpsilonGreedy`` uses its ``eps_eval``). The envs are seeded once
and continue their streams: successive evaluations see new initial states, and a run is reproducible.
"""

from __future__ import annotations

from typing import Any

from tensordict.nn import TensorDictModuleBase

from tdrl.collect.collector import BatchCollector
from tdrl.collect.factory import make_collector
from tdrl.envs import EnvFactory

__all__ = ["EvalCollector", "make_eval_collector"]


class EvalCollector:
    """Runs whole greedy episodes with a wait-reset serial ``collector``; ``evaluate()`` returns their TrajInfos
    (also kept in ``traj_infos``). The policy is evaluated with its current weights: there are none to load."""

    def __init__(self, collector: BatchCollector) -> None:
        self.collector = collector
        self.traj_infos: list[dict[str, float]] = []

    def evaluate(self) -> list[dict[str, float]]:
        """One episode per env with the policy's current weights."""
        self.collector.collect()
        self.traj_infos = self.collector.traj_infos
        return self.traj_infos

    def state_dict(self) -> dict[str, Any]:
        """Where the eval envs' streams stand (their state between evaluations), so a resumed run evaluates the
        same episodes."""
        return self.collector.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.collector.load_state_dict(state)

    def shutdown(self) -> None:
        self.collector.shutdown()

    def __enter__(self) -> EvalCollector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def make_eval_collector(env_id: str, policy: TensorDictModuleBase | None, *, n_envs: int, max_steps: int = 0, seed: int,
        discount: float = 0.99, env_kwargs: dict | None = None) -> EvalCollector | None:
    """The evaluator every recipe uses, or ``None`` when ``n_envs == 0`` (no evaluation).

    Args:
        env_id: gymnasium id (built with :class:`tdrl.envs.EnvFactory`).
        policy: the policy evaluated (its current weights at each call; ``None``: random actions).
        n_envs: episodes per evaluation, one per env.
        max_steps: episode time limit; 0 takes the env's own (1000 when it has none).
        seed: seed of the eval envs (use another than the training collector's).
        discount: discount of the TrajInfo ``DiscountedReturn``.
        env_kwargs: extra ``gymnasium.make`` arguments.
    """
    if n_envs == 0:
        return None
    kwargs = dict(env_kwargs or {})
    limit = max_steps or EnvFactory(env_id, kwargs).specs().max_episode_steps or 1000
    factory = EnvFactory(env_id, {**kwargs, "max_episode_steps": limit})
    return EvalCollector(make_collector("serial", factory, policy, batch_B=n_envs, batch_T=limit, seed=seed,
                                        reset_mode="wait_reset", exploration_type="deterministic",
                                        discount=discount, return_same_td=True))
