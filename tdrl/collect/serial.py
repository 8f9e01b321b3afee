"""Serial engine: everything in the calling process (rlpyt's SerialSampler).

It is the debugging twin of every parallel kind: same arguments, same batches for the same seed and a
deterministic policy, and ``breakpoint()`` works inside the policy or the env.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase

from tdrl.collect.common import sorted_infos
from tdrl.collect.runner import SliceRunner, SliceSettings, allocate, check_slices
from tdrl.collect.transform import load_statistics

__all__ = ["SerialEngine"]


class SerialEngine:
    """Steps ``batch_B`` envs and runs the caller's policy object (``None``: random actions) in this process."""

    def __init__(self, settings: SliceSettings, policy: TensorDictModuleBase | None, *, batch_B: int, batch_T: int,
            exploration: InteractionType = InteractionType.RANDOM, compile: bool = False) -> None:
        self.batch_B, self.batch_T, self.policy = batch_B, batch_T, policy
        self.specs, step_td, self.buffer = allocate(settings, policy, batch_B, batch_T, exploration)
        self.runner = SliceRunner(settings, 0, batch_B, step_td, self.buffer, policy, exploration, compile)
        self.policy_step = self.runner.policy_step

    def run(self, exploration: InteractionType) -> tuple[TensorDictBase, list[dict[str, float]]]:
        entries = self.runner.run_batch(exploration)
        self.runner.finish_batch()
        return self.buffer, sorted_infos(entries)

    def state_dict(self) -> dict[str, Any]:
        """The slice's envs, episodes and recurrent state; the torch RNG is the caller's (the trainer's ``Run``
        saves it)."""
        return {"slices": [self.runner.state_dict()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_slices(state["slices"], [(0, self.batch_B)])
        self.runner.load_state_dict(state["slices"][0])

    def restart_transform(self, statistics: dict[str, Any]) -> None:
        """Load ``statistics`` (a transform ``state_dict`` of the training collector) into the slice's transform,
        frozen (:func:`~tdrl.collect.transform.load_statistics`), and transform the envs' current observations
        afresh with them; their episodes must be starting (wait-reset, between batches: the evaluator)."""
        transform = self.runner.transform
        if transform is not None:
            load_statistics(transform.transform, statistics)
            transform.after_reset()

    def shutdown(self) -> None:
        self.runner.close()
