"""Level-based foraging as a BenchMARL task, for ``benchmarks/benchmarl_reference.py``'s worker (BenchMARL's venv
only: BenchMARL has no LBF task, so this gives it one the way its docs add a task, on TorchRL's PettingZoo wrapper).

lbforaging's gymnasium env steps through tdrl's own adapter, ``tdrl/envs/tuple_agents.py`` (loaded by path: the venv
cannot hold tdrl), as on tdrl's side: agents ``agent_0 ... agent_{n-1}``, grouped as ``agent`` as tdrl's MAPPO and
QMIX group them, and a global state of their observations concatenated. The time limit is lbforaging's own
(``max_episode_steps``, 50 on 8x8-2p-2f-coop), which ends the episode as terminated: no bootstrap from the last state.
"""

from __future__ import annotations

import copy
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import lbforaging  # noqa: F401  (registers the Foraging-* ids)
from benchmarl.environments.common import Task
from benchmarl.environments.pettingzoo.common import PettingZooClass
from pettingzoo.utils.env import ParallelEnv  # type: ignore[import-untyped]
from torchrl.envs import EnvBase, PettingZooWrapper


def _load_tuple_agents() -> Any:
    path = Path(__file__).resolve().parents[1] / "tdrl" / "envs" / "tuple_agents.py"
    spec = importlib.util.spec_from_file_location("tdrl_tuple_agents", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TupleAgents


TupleAgents: Any = _load_tuple_agents()  # tdrl.envs.tuple_agents.TupleAgents


class LbfParallel(TupleAgents, ParallelEnv):
    """lbforaging env ``env_id`` as a PettingZoo parallel env (a ``ParallelEnv``, which TorchRL's wrapper checks)."""

    metadata = {"name": "lbforaging", "render_modes": []}

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        super().__init__(gym.make(env_id, disable_env_checker=True, **kwargs).unwrapped)

    def render(self) -> None:
        return None


class LbfClass(PettingZooClass):
    """BenchMARL's task class for an lbforaging id (``config["env_id"]``, its other keys lbforaging's)."""

    def get_env_fun(self, num_envs: int, continuous_actions: bool, seed: int | None, device: Any
                    ) -> Callable[[], EnvBase]:
        config = copy.deepcopy(self.config)
        env_id = config.pop("env_id")

        def make() -> EnvBase:
            env = LbfParallel(env_id, **config)
            return PettingZooWrapper(env, categorical_actions=True, device=device, seed=seed, return_state=False,
                                     group_map={"agent": list(env.possible_agents)})
        return make

    def supports_continuous_actions(self) -> bool:
        return False

    def supports_discrete_actions(self) -> bool:
        return True

    def has_state(self) -> bool:
        return False

    def has_render(self, env: EnvBase) -> bool:
        return False

    def max_steps(self, env: EnvBase) -> int:
        return int(gym.spec(self.config["env_id"]).kwargs["max_episode_steps"])

    @staticmethod
    def env_name() -> str:
        return "lbforaging"


class LbfTask(Task):
    """BenchMARL's task enum for lbforaging: ``LbfTask.FORAGING.get_task({"env_id": ...})``."""

    FORAGING = None

    @staticmethod
    def associated_class() -> type[LbfClass]:
        return LbfClass
