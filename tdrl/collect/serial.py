"""Serial collector: everything in the calling process (rlpyt's SerialSampler + CpuResetCollector).

It is the debugging twin of every parallel collector: same arguments, same batches for the same seed and a
deterministic policy, and ``breakpoint()`` works inside the policy or the env.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.batch import allocate_batch
from tdrl.collect.common import (
    BufferedCollector,
    FrameBudget,
    active_exploration,
    check_batch_args,
    env_specs,
    game_score_of,
    load_weights,
    random_action_template,
    sorted_infos,
    to_interaction_type,
)
from tdrl.collect.policy import PolicyStep
from tdrl.collect.runner import OBS_KEYS, SliceRunner
from tdrl.collect.stepping import make_step_td

__all__ = ["SerialCollector"]


class SerialCollector(BufferedCollector):
    """Collects ``[batch_B, batch_T]`` batches by stepping ``batch_B`` envs in this process.

    rlpyt's ``batch_T`` (time steps per batch) and ``batch_B`` (envs) give a ``[batch_B, batch_T]``
    TensorDict (time last, TorchRL layout); see :mod:`tdrl.collect.batch` for the keys.

    Args:
        env_factory: picklable callable returning one gymnasium env (:class:`tdrl.envs.EnvFactory`).
        policy: TorchRL ``TensorDictModuleBase`` reading ``observation`` and writing ``action`` (and
            whatever else, all stored); ``None`` takes random actions from each env's action space.
        batch_B: number of envs.
        batch_T: time steps per batch.
        total_frames: iteration stops once this many frames were yielded (``-1``: never).
        seed: collector seed; env ``i`` gets an independent stream (:func:`tdrl.collect.stepping.env_seed`).
        reset_mode: ``"reset_at_once"`` (auto-reset) or ``"wait_reset"`` (finished envs idle until the batch
            ends; their steps are zeros with ``("collector","mask")`` False — for recurrent replay).
        max_decorrelation_steps: up to this many random steps per env at start-up (not batch data).
        discount: discount of the TrajInfo ``DiscountedReturn``.
        transform: optional TorchRL ``Transform`` (e.g. ``ObservationNorm``, ``RewardScaling``, ``Compose``)
            applied batched once per step where the envs are stepped (:mod:`tdrl.collect.transforms`).
        exploration_type: TorchRL exploration type the policy runs under; ``None`` (default) follows the
            caller's ``set_exploration_type`` context at each batch and is RANDOM outside one (as TorchRL's
            collectors; DETERMINISTIC for greedy/eval), or its name.
        device: device of the yielded batches.
        return_same_td: yield the internal buffer itself (no copy; overwritten by the next batch).
        fast_policy: allow the compiled policy fast path (:mod:`tdrl.collect.policy`).

    Attributes:
        traj_infos: TrajInfo dicts of the episodes that finished during the last batch, in (step, env) order.
        frames: frames yielded so far.

    Examples:
        >>> from tdrl.envs import EnvFactory
        >>> with SerialCollector(EnvFactory("CartPole-v1"), None, batch_B=4, batch_T=8, total_frames=64) as c:
        ...     for batch in c:
        ...         assert batch.batch_size == (4, 8)
    """

    def __init__(
        self,
        env_factory: Callable[..., Any],
        policy: TensorDictModuleBase | None = None,
        *,
        batch_B: int,
        batch_T: int,
        total_frames: int = -1,
        seed: int = 0,
        reset_mode: str = "reset_at_once",
        max_decorrelation_steps: int = 0,
        discount: float = 0.99,
        transform: Any = None,
        exploration_type: InteractionType | str | None = None,
        device: torch.device | str | None = None,
        return_same_td: bool = False,
        fast_policy: bool = True,
    ) -> None:
        check_batch_args(batch_B, batch_T, reset_mode)
        self.batch_B, self.batch_T = batch_B, batch_T
        self.budget = FrameBudget(total_frames, batch_B * batch_T)
        self.wait_reset = reset_mode == "wait_reset"
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.return_same_td = return_same_td
        self.policy = policy
        self.traj_infos: list[dict[str, float]] = []
        self._closed = False
        specs = env_specs(env_factory)
        self.specs = specs
        self.step_td = make_step_td(batch_B, specs.observation_spec, transform)
        self._exploration_arg = to_interaction_type(exploration_type, None)
        exploration = active_exploration(self._exploration_arg)
        template = (
            PolicyStep(policy, self.step_td.select(*OBS_KEYS).clone(), exploration_type=exploration).out_template
            if policy is not None
            else random_action_template(specs, batch_B)
        )
        self.buffer = allocate_batch(batch_B, batch_T, self.step_td, template)
        self.runner = SliceRunner(
            env_factory,
            0,
            batch_B,
            self.step_td,
            self.buffer,
            policy,
            seed=seed,
            wait_reset=self.wait_reset,
            discount=discount,
            game_score=game_score_of(env_factory),
            max_decorrelation_steps=max_decorrelation_steps,
            exploration_type=exploration,
            fast_policy=fast_policy,
            transform=transform,
        )
        self.policy_step = self.runner.policy_step

    # ------------------------------------------------------------------ collection
    def collect(self) -> TensorDictBase:
        """Collect one ``[batch_B, batch_T]`` batch (rlpyt's ``obtain_samples``); sets :attr:`traj_infos`."""
        if self._closed:
            raise RuntimeError("collector is shut down")
        if self.policy_step is not None:
            self.policy_step.exploration_type = active_exploration(self._exploration_arg)
        entries = self.runner.run_batch()
        self.runner.finish_batch()
        self.traj_infos = sorted_infos(entries)
        self.budget.count()
        return self._yielded_batch()

    # ------------------------------------------------------------------ protocol
    def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """The serial collector runs the caller's policy object itself; given weights are loaded into it.

        Args:
            policy_or_weights: ``None`` (nothing to do), a module (its weights are copied), a TensorDict of
                parameters (``TensorDict.from_module`` layout) or a ``state_dict``.
        """
        if policy_or_weights is None or self.policy is None or policy_or_weights is self.policy:
            return
        load_weights(self.policy, policy_or_weights)

    def state_dict(self) -> dict[str, Any]:
        """Counters (``frames``, ``iter``) and the transform's state (e.g. running statistics).

        Env state is not captured: resuming restarts episodes (exact resume is at iteration boundaries).
        """
        state: dict[str, Any] = self.budget.state_dict()
        if self.runner.envs.transform is not None:
            state["transform"] = self.runner.envs.transform.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.budget.load_state_dict(state_dict)
        if "transform" in state_dict and self.runner.envs.transform is not None:
            self.runner.envs.transform.load_state_dict(state_dict["transform"])

    def shutdown(self) -> None:
        """Close the envs; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self.runner.close()

    def __repr__(self) -> str:
        return f"SerialCollector(batch_B={self.batch_B}, batch_T={self.batch_T}, frames={self.frames})"

