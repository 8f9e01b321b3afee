"""Evaluation collector (rlpyt's eval collectors): its own envs, greedy policy, episode statistics only.

Each :meth:`EvalCollector.evaluate` call resets its envs (seeded on the first call, continuing each env's own
random stream afterwards, so successive evaluations see new initial states but a run is reproducible), steps
them with the policy under ``exploration_type`` (DETERMINISTIC by default: argmax / distribution mode) for at
most ``max_steps`` env steps in total, and returns the TrajInfos of the episodes that *finished*; episodes still
running at the step limit are dropped. With ``max_trajectories`` the evaluation stops as soon as that many
episodes finished.

Bias warning (as in rlpyt): episodes longer than ``max_steps / n_envs`` can never finish, so short episodes are
over-represented unless ``max_steps / n_envs`` is well above the episode length; a warning is issued when it is
below the env's time limit.

Eval envs run in the calling process on the caller's policy object (always the current weights), with seeds
derived from ``seed`` — pass a different seed from the training collector's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.common import (
    ClosesOnExit,
    env_specs,
    game_score_of,
    load_weights,
    sorted_infos,
    to_interaction_type,
)
from tdrl.collect.policy import PolicyStep
from tdrl.collect.runner import OBS_KEYS
from tdrl.collect.stepping import EnvSlice, make_step_td

__all__ = ["EvalCollector"]


class EvalCollector(ClosesOnExit):
    """Offline evaluation of a policy on ``n_envs`` dedicated envs.

    Args:
        env_factory: env constructor (same kind as the training collector's).
        policy: TorchRL policy (``None``: random actions, e.g. a baseline).
        n_envs: eval envs stepped together (rlpyt's ``eval_n_envs``).
        max_steps: env steps per evaluation, summed over envs (rlpyt's ``eval_max_steps``).
        max_trajectories: stop once this many episodes finished (rlpyt's ``eval_max_trajectories``).
        seed: seed of the eval envs.
        discount: discount of ``DiscountedReturn``.
        exploration_type: DETERMINISTIC (default, greedy) or e.g. RANDOM, or its name.
        transform: TorchRL transform applied batched each step (use frozen statistics for evaluation).

    Attributes:
        traj_infos: the episodes of the last evaluation.
    """

    def __init__(
        self,
        env_factory: Callable[..., Any],
        policy: TensorDictModuleBase | None,
        *,
        n_envs: int = 1,
        max_steps: int,
        max_trajectories: int | None = None,
        seed: int = 1,
        discount: float = 0.99,
        exploration_type: InteractionType | str | None = None,
        transform: Any = None,
    ) -> None:
        if not isinstance(n_envs, int) or n_envs < 1:
            raise ValueError(f"n_envs must be a positive int, got {n_envs!r}")
        if not isinstance(max_steps, int) or max_steps < n_envs:
            raise ValueError(f"max_steps must be an int >= n_envs ({n_envs}), got {max_steps!r}")
        if max_trajectories is not None and max_trajectories < 1:
            raise ValueError(f"max_trajectories must be positive or None, got {max_trajectories!r}")
        self.n_envs = n_envs
        self.max_steps = max_steps
        self.max_trajectories = max_trajectories
        self.policy = policy
        self.traj_infos: list[dict[str, float]] = []
        specs = env_specs(env_factory)
        self.steps_per_env = max_steps // n_envs
        if specs.max_episode_steps and self.steps_per_env < specs.max_episode_steps:
            warnings.warn(
                f"EvalCollector: max_steps / n_envs = {self.steps_per_env} is below the env's time limit "
                f"({specs.max_episode_steps}): long episodes cannot finish and short ones are over-represented",
                stacklevel=2,
            )
        self.step_td = make_step_td(n_envs, specs.observation_spec, transform)
        self.envs = EnvSlice(
            env_factory,
            range(n_envs),
            self.step_td,
            seed=seed,
            wait_reset=False,
            batch_T=1,
            discount=discount,
            game_score=game_score_of(env_factory),
            transform=transform,
        )
        self._started = False
        self._closed = False
        exploration = to_interaction_type(exploration_type, InteractionType.DETERMINISTIC)
        try:
            self.envs.start(0)
            self._started = True
            self.policy_step = (
                PolicyStep(policy, self.step_td.select(*OBS_KEYS).clone(), exploration_type=exploration)
                if policy is not None
                else None
            )
        except BaseException:
            self.envs.close()
            raise
        self._actions = specs.action_spec.zero((n_envs,)).numpy()
        self._fresh = True

    def evaluate(self) -> list[dict[str, float]]:
        """Run one evaluation and return the finished episodes' TrajInfos (also kept in :attr:`traj_infos`)."""
        if self._closed:
            raise RuntimeError("eval collector is shut down")
        envs, policy_step = self.envs, self.policy_step
        if not self._fresh:
            envs.restart()
        self._fresh = False
        envs.tracker = type(envs.tracker)(self.n_envs, envs.tracker.discount, envs.tracker.game_score)
        obs, is_init = self.step_td.get("observation"), self.step_td.get("is_init")
        finished: list[tuple[int, int, dict[str, float]]] = []
        if policy_step is not None:
            policy_step.reset_state()
        for t in range(self.steps_per_env):
            if policy_step is not None:
                with policy_step.running():
                    action = policy_step(obs, is_init)["action"]
                self._actions[:] = action.cpu().numpy()
            else:
                envs.sample_actions(self._actions)
            envs.step(0, self._actions)
            if envs.done.any():
                finished += [(t, i, info) for _, i, info in envs.batch_traj_infos(None)]
                if self.max_trajectories is not None and len(finished) >= self.max_trajectories:
                    break
            else:
                envs.batch_traj_infos(None)
        infos = sorted_infos(finished)
        if self.max_trajectories is not None:
            infos = infos[: self.max_trajectories]
        self.traj_infos = infos
        return infos

    __call__ = evaluate

    def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """Runs the caller's policy itself; given weights are loaded into it."""
        if self.policy is not None and policy_or_weights is not None and policy_or_weights is not self.policy:
            load_weights(self.policy, policy_or_weights)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self.envs.close()
