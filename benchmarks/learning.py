"""Learning benchmark: each recipe on its reference task over seeds, env frames and wall-clock to a threshold.

For every task, the recipe's ``main(cfg)`` runs in this process with its defaults (plus the task's overrides) and
the greedy evaluation return is read at every log interval (``summary["curve"]``). Reported per seed: the first
env frame count and training wall-clock (evaluation time excluded) at which the evaluation return reached the
threshold, and the final evaluation return at the end of the budget. When stable-baselines3 is installed, SB3's
implementation of the same algorithm with RL-Zoo hyperparameters runs in the same process on the same task,
evaluated the same way (greedy, same number of episodes, same cadence, evaluation time excluded), so the ratio
of wall-clock to threshold is measured side by side.

    cd $(mktemp -d) && python /path/to/benchmarks/learning.py                     # every default task, 3 seeds
    python benchmarks/learning.py --tasks sac-pendulum --stop --quiet 0.1          # each run waits for idle cores
    python benchmarks/learning.py --tasks ppo-cartpole --seeds 0,1,2 --json out.json
    python benchmarks/learning.py --tasks ppo-halfcheetah --no-sb3 --stop         # long (not in the default set)
    python benchmarks/learning.py --rows a.json b.json --markdown docs/learning.md#ddpg  # report runs made apart
    python benchmarks/learning.py --runs runs/sweeps/mujoco_ppo --keep docs/data   # a sweep's results, as a CSV
    python benchmarks/learning.py --runs docs/data/mujoco_ppo.csv --markdown docs/mujoco.md#ppo  # its report again
    python benchmarks/learning.py --gae --losses all                              # micro: tdrl vs TorchRL, ms/call
    python benchmarks/learning.py --iteration all          # whole recipe iterations: TorchRL's loss vs tdrl's own

Run it from a temporary directory (MuJoCo writes MUJOCO_LOG.TXT into the cwd) and when the machine is quiet:
wall-clock numbers on a shared 2-core machine are noisy, so compare the tdrl/SB3 ratio within one run.

Tasks are :class:`Task` rows in :data:`TASKS`; adding a recipe means adding a row (and, optionally, its SB3
baseline function).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import functools
import importlib.util
import io
import json
import math
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

os.environ.setdefault("WANDB_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(ROOT))  # this checkout's tdrl, as its recipes expect (not another installed copy)
from collectors import wait_until_quiet  # noqa: E402  (the collectors benchmark's /proc/stat check)

from tdrl.utils.scripts import load_module  # noqa: E402

# each run starts from torch's own thread count: recipes set theirs (run.torch_threads), SB3 keeps torch's default,
# and a recipe's setting must not leak into the SB3 run that follows it in this process
DEFAULT_TORCH_THREADS = torch.get_num_threads()


@dataclass
class Task:
    """One benchmark row: a recipe on its reference task.

    Attributes:
        name: row name (``--tasks``).
        recipe: ``recipes/<recipe>.py``.
        env_id: gymnasium id.
        threshold: evaluation return to reach.
        budget: env frames.
        overrides: dotted config overrides on top of the recipe's defaults.
        eval_interval: env frames between evaluations (both implementations).
        eval_episodes: greedy episodes per evaluation.
        checkpoint_frames: env frames between an SB3 run's checkpoints when it has a run directory.
        sb3: ``fn(seed, task, stop, run_dir=None) -> curve`` running SB3's implementation, or ``None``
            (with ``run_dir``: checkpointed there, resumed by a relaunch; see :func:`_sb3_curve`).
        default: part of the default task set.
    """

    name: str
    recipe: str
    env_id: str
    threshold: float
    budget: int
    overrides: list[str] = field(default_factory=list)
    eval_interval: int = 5_000
    eval_episodes: int = 10
    checkpoint_frames: int = 20_000
    sb3: Callable[..., list[dict[str, float]]] | None = None
    default: bool = True


# --- tdrl -------------------------------------------------------------------------------------------------------


def load_recipe(name: str) -> Any:
    return load_module(f"_recipe_{name}", ROOT / "recipes" / f"{name}.py")


def run_tdrl(task: Task, seed: int, root: Path, stop: bool = False, run_dir: Path | None = None,
             extra: Sequence[str] = ()) -> list[dict[str, float]]:
    """The task's recipe in this process; with ``run_dir``, a checkpointed run there that a relaunch resumes."""
    from tdrl.config import apply_overrides

    recipe = load_recipe(task.recipe)
    where = [f"run.dir={run_dir}"] if run_dir is not None else [f"run.root={root}", "checkpoint.snapshot_mode=none"]
    cfg = apply_overrides(recipe.Config(), [
        f"env.id={task.env_id}", f"collector.total_frames={task.budget}", f"run.seed={seed}", *where,
        f"logger.log_interval_steps={task.eval_interval}", f"eval.n_envs={task.eval_episodes}",
        "logger.wandb=false", "logger.progress_bar=false",
        *([f"stop_return={task.threshold}"] if stop else []), *task.overrides, *extra,
    ])
    return recipe.main(cfg)["curve"]


# --- Stable-Baselines3 ------------------------------------------------------------------------------------------


def _sb3_curve(model: Any, task: Task, seed: int, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """Train ``model`` for the task's budget, evaluating greedily every ``eval_interval`` frames after an update.

    With ``run_dir``, the run writes tdrl's files there (``progress.csv`` with ``CumSteps``, ``eval/return_mean``,
    ``time/train_s``, so ``tdrl plot`` draws both implementations; ``summary.json`` at the end) and checkpoints
    itself every ``task.checkpoint_frames`` (model, optimizers, replay buffer, VecNormalize statistics, curve,
    evaluation envs' RNGs). A relaunch resumes from the checkpoint: the same frames, updates, curve and evaluation
    episodes, with a fresh training episode (SB3 cannot save its env's state), so not bitwise as tdrl's runs are.
    """
    from stable_baselines3.common.logger import Logger

    from tdrl.utils.files import write_json_atomic

    run = _SB3Run(model, task, seed, stop, run_dir)
    run.model.set_logger(Logger(folder=None, output_formats=[]))  # SB3's default makes a /tmp/SB3-<time> per run
    run.model.learn(total_timesteps=task.budget - run.model.num_timesteps, callback=_eval_callback(run),
                    reset_num_timesteps=False)
    for env in run.eval_envs:
        env.close()
    if run_dir is not None:
        write_json_atomic(run_dir / "summary.json", {"frames": run.model.num_timesteps, "curve": run.state["curve"]})
    return run.state["curve"]


class _SB3Run:
    """One SB3 run of :func:`_sb3_curve`: its model (resumed from its checkpoint if there is one), the evaluation
    envs and the curve so far (``state``), and the checkpoint it saves."""

    def __init__(self, model: Any, task: Task, seed: int, stop: bool, run_dir: Path | None) -> None:
        from tdrl.collect.stepping import env_seed

        self.task, self.stop, self.run_dir = task, stop, run_dir
        # The recipes evaluate with a wait-reset collector seeded run.seed + 10_000: env i is reset with
        # env_seed(seed + 10_000, i) once and then continues its own RNG, one episode per evaluation. SB3 is
        # evaluated on the very same initial states (a fixed eval set for one and fresh states for the other biased
        # the threshold crossing by up to 2 evaluations on Pendulum).
        self.eval_envs = [_gym_env(task.env_id)() for _ in range(task.eval_episodes)]
        self.reset_seeds: list[int | None] = [env_seed(seed + 10_000, i) for i in range(task.eval_episodes)]
        self.state: dict[str, Any] = {"curve": [], "train_s": 0.0, "next_eval": 0, "reached": False}
        self.checkpoint = run_dir / "sb3_checkpoint" if run_dir is not None else None
        # state.pkl is written last, so it marks a complete checkpoint; ".old" is the previous one while a save swaps
        candidates = (self.checkpoint, self.checkpoint.with_name(self.checkpoint.name + ".old")) \
            if self.checkpoint is not None else ()
        saved = [c for c in candidates if (c / "state.pkl").is_file()]
        if saved:
            model, self.state, self.reset_seeds = _sb3_resume(model, saved[0], self.eval_envs)
            print(f"resumed SB3 from {saved[0]} at {model.num_timesteps:,} frames", flush=True)
        self.model = model
        self.train_env = model.get_env()

    def evaluate(self) -> float:
        """The mean greedy return of one episode on each evaluation env (normalised as in training, if
        VecNormalize); finished envs are not stepped (no autoreset), so their RNGs stay in step."""
        from stable_baselines3.common.vec_env import VecNormalize

        episodes = self.task.eval_episodes
        obs = np.stack([env.reset(seed=self.reset_seeds[i])[0] for i, env in enumerate(self.eval_envs)])
        self.reset_seeds[:] = [None] * len(self.reset_seeds)
        active = np.ones(episodes, bool)
        ret = np.zeros(episodes)
        while active.any():
            live = np.flatnonzero(active)
            normalize = isinstance(self.train_env, VecNormalize)
            model_obs = self.train_env.normalize_obs(obs[live]) if normalize else obs[live]
            action, _ = self.model.predict(model_obs, deterministic=True)
            for j, i in enumerate(live):
                obs[i], reward, term, trunc, _ = self.eval_envs[i].step(action[j])
                ret[i] += reward
                active[i] = not (term or trunc)
        return float(ret.mean())

    def save(self) -> None:
        """The new checkpoint complete beside the old, then swapped in."""
        from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
        from stable_baselines3.common.vec_env import VecNormalize

        assert self.checkpoint is not None
        fresh = self.checkpoint.with_name(self.checkpoint.name + ".new")
        fresh.mkdir(parents=True, exist_ok=True)
        self.model.save(fresh / "model.zip")
        if isinstance(self.model, OffPolicyAlgorithm):
            self.model.save_replay_buffer(fresh / "replay.pkl")
        if isinstance(self.train_env, VecNormalize):
            self.train_env.save(str(fresh / "vecnormalize.pkl"))
        rngs = [env.np_random for env in self.eval_envs]
        (fresh / "state.pkl").write_bytes(pickle.dumps({"state": self.state, "reset_seeds": self.reset_seeds,
                                                        "rngs": rngs}))
        old = self.checkpoint.with_name(self.checkpoint.name + ".old")
        if self.checkpoint.exists():
            self.checkpoint.rename(old)
        fresh.rename(self.checkpoint)
        shutil.rmtree(old, ignore_errors=True)

    def eval_if_due(self, frames: int) -> None:
        """At ``frames`` (after an update): evaluate if an evaluation is due, checkpoint if a checkpoint is."""
        state, task = self.state, self.task
        if frames >= state["next_eval"]:
            ret = self.evaluate()
            state["curve"].append({"frames": frames, "train_s": round(state["train_s"], 3), "return_mean": ret})
            state["next_eval"] = (frames // task.eval_interval + 1) * task.eval_interval
            state["reached"] = state["reached"] or ret >= task.threshold
            if self.run_dir is not None:
                _write_progress(self.run_dir, state["curve"])
        if self.checkpoint is not None and frames >= state.get("next_checkpoint", task.checkpoint_frames):
            state["next_checkpoint"] = (frames // task.checkpoint_frames + 1) * task.checkpoint_frames
            self.save()


def _eval_callback(run: _SB3Run) -> Any:
    """SB3's callback for ``run``: the training seconds (evaluation excluded), an evaluation when one is due after
    each update, a stop at the threshold with ``run.stop``, a last evaluation at the end."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EvalEvery(BaseCallback):
        since = 0.0  # when the training seconds last resumed

        def _eval_if_due(self) -> None:
            run.state["train_s"] += time.perf_counter() - self.since
            run.eval_if_due(self.num_timesteps)
            self.since = time.perf_counter()

        def _on_training_start(self) -> None:
            self.since = time.perf_counter()
            self._eval_if_due()

        def _on_rollout_start(self) -> None:  # after the previous update, like tdrl's log boundary
            self._eval_if_due()

        def _on_step(self) -> bool:
            return not (run.stop and run.state["reached"])

        def _on_training_end(self) -> None:
            if not (run.stop and run.state["reached"]):
                run.state["next_eval"] = 0
                self._eval_if_due()

    return EvalEvery()


def _gym_env(env_id: str) -> Callable[[], Any]:
    """What SB3 trains and is evaluated on: ``gymnasium.make(env_id)``, except MinAtar, which only tdrl's env
    factory turns into images (``[C, 10, 10]`` uint8)."""
    import gymnasium as gym

    from tdrl.envs import EnvFactory

    return EnvFactory(env_id) if env_id.startswith("MinAtar/") else lambda: gym.make(env_id)


def _sb3_resume(model: Any, checkpoint: Path, eval_envs: list[Any]) -> tuple[Any, dict[str, Any], list[int | None]]:
    """The SB3 model of ``checkpoint`` on ``model``'s (fresh) env, and the curve's and evaluation envs' state."""
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
    from stable_baselines3.common.vec_env import VecNormalize

    env = model.get_env()
    if isinstance(env, VecNormalize):
        env = VecNormalize.load(str(checkpoint / "vecnormalize.pkl"), env.venv)
    model = type(model).load(checkpoint / "model.zip", env=env, device="cpu")  # env given: reset before training
    if isinstance(model, OffPolicyAlgorithm):
        model.load_replay_buffer(checkpoint / "replay.pkl")
    saved = pickle.loads((checkpoint / "state.pkl").read_bytes())
    for env_, rng in zip(eval_envs, saved["rngs"], strict=True):
        env_.np_random = rng
    return model, saved["state"], saved["reset_seeds"]


def _write_progress(run_dir: Path, curve: list[dict[str, float]]) -> None:
    """``progress.csv`` in tdrl's column names (what ``tdrl plot`` and the launcher's status read)."""
    from tdrl.utils.files import write_atomic

    lines = ["CumSteps,eval/return_mean,time/train_s"]
    lines += [f"{p['frames']},{p['return_mean']!r},{p['train_s']!r}" for p in curve]
    write_atomic(run_dir / "progress.csv", "\n".join(lines) + "\n")  # whole: a resume drops rows past its checkpoint


def sb3_ppo_cartpole(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo ppo.yml CartPole-v1: 8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, lambda 0.8, linear lr/clip."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(task.env_id, n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_a2c_cartpole(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo a2c.yml CartPole-v1: 8 envs, ent_coef 0 (SB3 defaults otherwise: n_steps 5, lr 7e-4, RMSprop)."""
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(task.env_id, n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def _sb3_ppo_mujoco(seed: int, task: Task, stop: bool, run_dir: Path | None, **hyper: Any
        ) -> list[dict[str, float]]:
    """RL-Zoo's MuJoCo PPO: 1 env x 512 steps, VecNormalize, ReLU 256x256 without orthogonal init, log-std -2."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env(task.env_id, n_envs=1, seed=seed), gamma=hyper["gamma"])
    model = PPO("MlpPolicy", env, n_steps=512, **hyper, seed=seed, device="cpu", verbose=0,
                policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                                   net_arch=dict(pi=[256, 256], vf=[256, 256])))
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_ppo_halfcheetah(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo ppo.yml HalfCheetah (v4 hyperparameters)."""
    return _sb3_ppo_mujoco(seed, task, stop, run_dir, batch_size=64, gae_lambda=0.92, gamma=0.98, n_epochs=20,
                           ent_coef=0.000401762, learning_rate=2.0633e-05, clip_range=0.1, max_grad_norm=0.8,
                           vf_coef=0.58096)


def sb3_ppo_hopper(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo ppo.yml Hopper (v4 hyperparameters)."""
    return _sb3_ppo_mujoco(seed, task, stop, run_dir, batch_size=32, gae_lambda=0.99, gamma=0.999, n_epochs=5,
                           ent_coef=0.00229519, learning_rate=9.80828e-05, clip_range=0.2, max_grad_norm=0.7,
                           vf_coef=0.835671)


def sb3_dqn_cartpole(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo dqn.yml CartPole-v1: lr 2.3e-3, batch 64, buffer 100k, start 1000, train_freq 256 with 128 gradient
    steps, target update 10, exploration 16 % of the budget to 0.04, net [256, 256]."""
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", task.env_id, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_dqn_minatar(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """SB3's DQN with the MinAtar paper's network (16 3x3 convolutions, 128 units) on tdrl's MinAtar images, at the
    tdrl row's settings: replay 100k, batch 32, one update per 4 frames, target every 1000 updates (4000 frames),
    lr 2.5e-4 with Adam eps 3.125e-4, learning from 5k frames, epsilon 1 -> 0.1 over 100k frames."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    class MinAtarNet(BaseFeaturesExtractor):
        def __init__(self, observation_space: Any) -> None:
            super().__init__(observation_space, features_dim=128)
            channels, height, width = observation_space.shape
            self.net = torch.nn.Sequential(torch.nn.Conv2d(channels, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                           torch.nn.Linear(16 * (height - 2) * (width - 2), 128), torch.nn.ReLU())

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.net(obs)

    env = make_vec_env(_gym_env(task.env_id), n_envs=1, seed=seed)
    model = DQN("CnnPolicy", env, learning_rate=2.5e-4, batch_size=32, buffer_size=100_000, learning_starts=5000,
                gamma=0.99, target_update_interval=4000, train_freq=4, gradient_steps=1,
                exploration_fraction=100_000 / task.budget, exploration_final_eps=0.1,
                policy_kwargs=dict(features_extractor_class=MinAtarNet, net_arch=[],
                                   optimizer_kwargs=dict(eps=3.125e-4)), seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_sac_pendulum(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo sac.yml Pendulum-v1: lr 1e-3 (SB3 defaults otherwise: [256, 256], batch 256, start 100, one update
    per step, tau 0.005, automatic entropy)."""
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", task.env_id, learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def _sb3_deterministic_pendulum(algo: Any, seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo td3.yml / ddpg.yml Pendulum-v1: gamma 0.98, buffer 200k, start 10000, normal noise 0.1, one update per
    step after each episode, lr 1e-3, net [400, 300]."""
    from stable_baselines3.common.noise import NormalActionNoise

    noise = NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1))
    model = algo("MlpPolicy", task.env_id, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                 action_noise=noise, gradient_steps=-1, train_freq=(1, "episode"), learning_rate=1e-3,
                 policy_kwargs=dict(net_arch=[400, 300]), seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_sac_mujoco(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo sac.yml HalfCheetah/Hopper: learning from 10k frames, SB3's defaults otherwise (lr 3e-4, [256, 256],
    batch 256, one update per frame, tau 0.005, automatic entropy); a replay as large as the budget (= 1M's)."""
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", task.env_id, learning_starts=10_000, buffer_size=task.budget, seed=seed, device="cpu",
                verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_td3_mujoco(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    """RL-Zoo td3.yml HalfCheetah/Hopper: learning from 10k frames, Gaussian exploration noise 0.1, SB3's defaults
    otherwise (lr 1e-3, [400, 300], batch 256, one update per frame, policy delay 2)."""
    import gymnasium as gym
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    shape = gym.make(task.env_id).action_space.shape
    assert shape is not None  # a Box
    n_actions = shape[0]
    noise = NormalActionNoise(mean=np.zeros(n_actions), sigma=0.1 * np.ones(n_actions))
    model = TD3("MlpPolicy", task.env_id, learning_starts=10_000, action_noise=noise, buffer_size=task.budget,
                seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop, run_dir)


def sb3_td3_pendulum(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    from stable_baselines3 import TD3

    return _sb3_deterministic_pendulum(TD3, seed, task, stop, run_dir)


def sb3_ddpg_pendulum(seed: int, task: Task, stop: bool = False, run_dir: Path | None = None
        ) -> list[dict[str, float]]:
    from stable_baselines3 import DDPG

    return _sb3_deterministic_pendulum(DDPG, seed, task, stop, run_dir)


# --- Tasks ------------------------------------------------------------------------------------------------------

# RL-Zoo's MuJoCo PPO, common to its HalfCheetah and Hopper rows: 1 env x 512 steps, ReLU 256x256 without
# orthogonal init, log-std -2, constant lr and clip; observations normalised in the model and rewards divided by
# the running std of the discounted return (SB3: VecNormalize). One seed of HalfCheetah with a constant reward
# scale (0.1) instead: 3,700-4,600 over 344-492k frames against 5,100-5,800 (docs/mujoco.md#ppo)
RLZOO_MUJOCO_PPO = ["collector.batch_B=1", "collector.batch_T=512", "model.hidden_sizes=[256,256]",
                    "model.activation=relu", "model.init_log_std=-2", "model.distribution=normal",
                    "model.normalize_observation=true", "loss.normalize_reward=true", "loss.linear_decay=false"]

# MinAtar paper's DQN settings (replay 100k, batch 32, target every 1000 updates, epsilon 1 -> 0.1 over 100k frames,
# learning from 5k frames) with one update per 4 frames (Nature DQN; the paper: 1); one torch thread (the recipe's 2
# stall when another run shares the cores: 60 frames/s instead of ~700)
MINATAR_DQN = ["replay.size=100000", "optim.batch_size=32", "optim.replay_ratio=8", "optim.lr=2.5e-4",
               "optim.lr_final=none", "optim.min_steps_learn=5000", "optim.target_update_interval=1000",
               "exploration.eps_final=0.1", "exploration.eps_steps=100000", "optim.adam_eps=3.125e-4",
               "loss.gamma=0.99", "run.torch_threads=1"]

# RL-Zoo's TD3 on MuJoCo (td3.yml: SB3's defaults, lr 1e-3, [400, 300], batch 256, one update per frame) on the
# recipe, beside SB3 with the same settings
TD3_RLZOO = ["optim.actor_lr=1e-3", "optim.critic_lr=1e-3", "optim.batch_size=256", "optim.replay_ratio=256",
             "model.hidden_sizes=[400,300]"]
# The TD3 author's updated settings (lr 3e-4, [256, 256], batch 256: github.com/sfujim/TD3), the TD3 rows' until
# 2026-11-28: seed 0 on HalfCheetah 4,411 at 100k against RL-Zoo's 6,341 (rows td3-*-author,
# slurm/sweeps/td3_author_settings.py); batch 100 (the paper's) reached 4,666 at 200k
TD3_AUTHOR = ["optim.actor_lr=3e-4", "optim.critic_lr=3e-4", "optim.batch_size=256", "optim.replay_ratio=256"]

TASKS: list[Task] = [
    Task("ppo-cartpole", "ppo", "CartPole-v1", threshold=475, budget=100_000, eval_interval=5_000,
         sb3=sb3_ppo_cartpole),
    Task("a2c-cartpole", "a2c", "CartPole-v1", threshold=475, budget=500_000, eval_interval=10_000,
         sb3=sb3_a2c_cartpole),
    Task("impala-cartpole", "impala", "CartPole-v1", threshold=475, budget=500_000, eval_interval=10_000),
    Task("dqn-cartpole", "dqn", "CartPole-v1", threshold=475, budget=100_000, eval_interval=5_000,
         sb3=sb3_dqn_cartpole),
    Task("c51-cartpole", "dqn", "CartPole-v1", threshold=475, budget=100_000, eval_interval=5_000,
         overrides=["model.categorical=true"]),
    Task("sac-pendulum", "sac", "Pendulum-v1", threshold=-200, budget=20_000, eval_interval=1_000,
         sb3=sb3_sac_pendulum),
    Task("td3-pendulum", "td3", "Pendulum-v1", threshold=-200, budget=20_000, eval_interval=1_000,
         sb3=sb3_td3_pendulum),
    Task("ddpg-pendulum", "ddpg", "Pendulum-v1", threshold=-250, budget=30_000, eval_interval=1_000,
         sb3=sb3_ddpg_pendulum),
    # trainer.kind=ray: 4 collector actors on the cluster RAY_ADDRESS names (benchmarks/distributed.py --learning
    # runs these on a loopback cluster of two simulated nodes)
    Task("apex-dqn-cartpole", "dqn", "CartPole-v1", threshold=475, budget=100_000, eval_interval=5_000, default=False,
         overrides=["trainer.kind=ray", "trainer.n_actors=4", "trainer.updates_per_sync=8",
                    "replay.prioritized=true"]),
    Task("impala-ray-cartpole", "impala", "CartPole-v1", threshold=475, budget=500_000, eval_interval=10_000,
         default=False, overrides=["trainer.kind=ray", "trainer.n_actors=4"]),
    Task("apex-dpg-pendulum", "ddpg", "Pendulum-v1", threshold=-200, budget=30_000, eval_interval=1_000,
         default=False, overrides=["trainer.kind=ray", "trainer.n_actors=4", "trainer.updates_per_sync=8",
                                   "collector.batch_T=8"]),
    Task("ppo-halfcheetah", "ppo", "HalfCheetah-v5", threshold=1500, budget=1_000_000, eval_interval=25_000,
         eval_episodes=5, default=False, sb3=sb3_ppo_halfcheetah,
         # RL-Zoo's HalfCheetah PPO hyperparameters (1 env x 512 steps, 20 epochs of 64-sample minibatches, ReLU
         # 256x256, log-std -2, lr 2e-5, clip 0.1)
         overrides=[*RLZOO_MUJOCO_PPO, "loss.gamma=0.98", "loss.gae_lambda=0.92", "loss.epochs=20",
                    "loss.minibatches=8", "loss.clip_epsilon=0.1", "optim.lr=2e-5", "optim.max_grad_norm=0.8",
                    "loss.value_loss_coeff=1.16", "loss.entropy_coeff=0.0004"]),
    # MuJoCo at 200k frames (not in the default set; slurm/sweeps/mujoco_offpolicy.py runs them resumably): the
    # recipes' MuJoCo settings (their docstrings) against RL-Zoo's, evaluated every 10k frames on 10 episodes. The
    # thresholds only mark a level reached (--stop); the reference page reports returns.
    *[Task(f"{algo}-{env.split('-')[0].lower()}{suffix}", algo, env, threshold=threshold, budget=200_000,
           eval_interval=10_000, default=False, sb3=sb3_fn,
           overrides=["replay.size=200000", "optim.min_steps_learn=10000", *settings])
      for algo, suffix, sb3_fn, settings in (("sac", "", sb3_sac_mujoco, ["optim.lr=3e-4"]),
                                             ("td3", "", sb3_td3_mujoco, TD3_RLZOO),
                                             ("td3", "-author", None, TD3_AUTHOR))
      for env, threshold in (("HalfCheetah-v5", 4000), ("Hopper-v5", 2500))],
    # RL-Zoo's Hopper PPO (1 env x 512 steps, 5 epochs of 32-sample minibatches, gamma 0.999, lambda 0.99, clip 0.2,
    # lr 9.8e-5, log-std -2, ReLU 256x256)
    Task("ppo-hopper", "ppo", "Hopper-v5", threshold=1500, budget=1_000_000, eval_interval=25_000, eval_episodes=5,
         default=False, sb3=sb3_ppo_hopper,
         overrides=[*RLZOO_MUJOCO_PPO, "loss.gamma=0.999", "loss.gae_lambda=0.99", "loss.epochs=5",
                    "loss.minibatches=16", "loss.clip_epsilon=0.2", "optim.lr=9.8e-5", "optim.max_grad_norm=0.7",
                    "loss.value_loss_coeff=1.67", "loss.entropy_coeff=0.0023"]),
    # R2D1's quick recurrent check: CartPole observing only position and angle (a POMDP), the recipe's defaults
    Task("r2d1-cartpole-novel", "r2d1", "tdrl/CartPoleNoVelocity-v1", threshold=475, budget=300_000,
         eval_interval=10_000),
    # MinAtar (pip install 'tdrl[minatar]'): 10x10 image games, the CPU-scale Atari family; MINATAR_DQN's settings on
    # the recipe's double + dueling 3-step DQN
    Task("dqn-minatar-breakout", "dqn", "MinAtar/Breakout-v1", threshold=10, budget=250_000, eval_interval=25_000,
         default=False, sb3=sb3_dqn_minatar,
         overrides=MINATAR_DQN),
    # the same with SB3's algorithm (no double DQN, no dueling head, 1-step returns): what the recipe's choices cost
    Task("dqn-minatar-breakout-nature", "dqn", "MinAtar/Breakout-v1", threshold=10, budget=250_000,
         eval_interval=25_000, default=False,
         overrides=[*MINATAR_DQN, "loss.double=false", "model.dueling=false", "loss.n_step=1"]),
    # R2D1 on MinAtar: the DQN row's exploration; 16 sequences of 10 burn-in + 20 trained steps per update, one update
    # per ~18 frames (replay ratio 32 over all 35 steps), the target copied every 500 updates (~8k frames), constant
    # lr 3e-4 with Adam eps 1e-5 (with the recipe's CartPole lr, eps 1e-3 and 1000-update target copies it stayed
    # near random play)
    Task("r2d1-minatar-breakout", "r2d1", "MinAtar/Breakout-v1", threshold=10, budget=250_000, eval_interval=25_000,
         default=False,
         overrides=["model.lstm_size=128", "model.head_sizes=[128]", "replay.warmup_T=10", "optim.batch_B=16",
                    "optim.lr=3e-4", "optim.lr_final=none", "optim.adam_eps=1e-5", "optim.replay_ratio=32",
                    "optim.min_steps_learn=5000", "optim.target_update_interval=500", "exploration.eps_final=0.1",
                    "exploration.eps_steps=100000"]),
]


# --- GAE micro-benchmark ------------------------------------------------------------------------------------------


CLOCK: Callable[[], float] = time.perf_counter
"""Clock of the micro-benchmarks and profiles; ``--cpu-time`` sets ``time.process_time`` (this process's CPU time:
on a shared machine it moves far less with the load than wall-clock, and with one torch thread it is the work)."""


def ms_per_call(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
    """Milliseconds per call of ``fn`` over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    start = CLOCK()
    for _ in range(repeats):
        fn()
    return (CLOCK() - start) / repeats * 1e3


def bench_gae(repeats: int = 300) -> None:
    """tdrl's one-forward GAE vs TorchRL's GAE module on CartPole-sized batches (best of 2 rounds, ms per call)."""
    from tensordict import TensorDict
    from torchrl.objectives.value import GAE as TorchRLGAE

    from tdrl.envs import EnvFactory
    from tdrl.models import make_actor_critic
    from tdrl.objectives.advantage import GAE

    ac = make_actor_critic(EnvFactory("CartPole-v1").specs())
    print(f"{'batch':>8s} {'torchrl ms':>11s} {'tdrl ms':>8s} {'speed-up':>9s}")
    for B, T in [(8, 5), (16, 8), (8, 64), (16, 128)]:
        td = TensorDict({"observation": torch.randn(B, T, 4), "next": {
            "observation": torch.randn(B, T, 4), "reward": torch.randn(B, T, 1),
            "done": torch.zeros(B, T, 1, dtype=torch.bool), "terminated": torch.zeros(B, T, 1, dtype=torch.bool)}},
            [B, T])
        theirs = TorchRLGAE(gamma=0.98, lmbda=0.8, value_network=ac.critic, deactivate_vmap=True)
        ours = GAE(ac.critic, gamma=0.98, lmbda=0.8)

        def torchrl_call(theirs: Any = theirs, td: Any = td) -> None:
            with torch.no_grad():
                theirs(td)

        best: dict[str, float] = {}
        for name, fn in [("torchrl", torchrl_call), ("tdrl", lambda ours=ours, td=td: ours(td))] * 2:
            best[name] = min(best.get(name, math.inf), ms_per_call(fn, repeats, warmup=20))
        print(f"{B:>3d}x{T:<4d} {best['torchrl']:11.3f} {best['tdrl']:8.3f} {best['torchrl'] / best['tdrl']:8.2f}x")


Step = Callable[[], Any]
"""One update, as a recipe steps it."""


def _adam(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(list(params), lr=1e-4, fused=True)


def _step_on(updater: Any, loss: Any, td: Any) -> Step:
    return lambda: updater.step(loss(td.clone(False)))


def _update_steps(algo: str) -> dict[str, Step]:
    """One update of ``algo`` as its recipe steps it (recipe batch size, networks and optimizers), with TorchRL's
    loss and with tdrl's own loss: ``{"torchrl": step, "tdrl": step}``."""
    from tensordict import TensorDict

    if algo == "ppo":
        return _ppo_steps()
    if algo == "dqn":
        return _dqn_steps()
    n = {"sac": 256, "td3": 100}[algo]  # SAC 256 samples, TD3 100; [256, 256] MLPs
    td = TensorDict({"observation": torch.randn(n, 3), "action": torch.rand(n, 1) * 4 - 2,
                     ("next", "observation"): torch.randn(n, 3), ("next", "reward"): -torch.rand(n, 1) * 16,
                     ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool)}, [n])
    return {name: (_sac_step if algo == "sac" else _td3_step)(name, td) for name in ("torchrl", "tdrl")}


def _ppo_steps() -> dict[str, Step]:
    """PPO's update on 8 x 32 CartPole steps per minibatch, TorchRL's ``ClipPPOLoss`` and tdrl's ``PPOLoss``."""
    from tensordict import TensorDict
    from torchrl.objectives import ClipPPOLoss

    from tdrl.envs import EnvFactory
    from tdrl.models import make_actor_critic
    from tdrl.objectives.policy_gradient import PPOLoss
    from tdrl.objectives.update import Updater

    n = 256
    ac = make_actor_critic(EnvFactory("CartPole-v1").specs())
    td = TensorDict({"observation": torch.randn(n, 4)}, [n])
    with torch.no_grad():
        ac.actor(td)
    td["advantage"], td["value_target"] = torch.randn(n, 1), torch.randn(n, 1)
    kwargs: dict[str, Any] = dict(clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0, normalize_advantage=True)
    losses = (("torchrl", ClipPPOLoss(ac.actor, ac.critic, loss_critic_type="l2", **kwargs)),
              ("tdrl", PPOLoss(ac, **kwargs)))
    return {name: _step_on(Updater(_adam(ac.parameters()), max_grad_norm=0.5), loss, td) for name, loss in losses}


def _dqn_steps() -> dict[str, Step]:
    """DQN's update on 64 CartPole samples, dueling [256, 256], double DQN, Huber: TorchRL's loss and tdrl's."""
    from tensordict import TensorDict

    from tdrl.envs import EnvFactory
    from tdrl.models.q import make_q_actor
    from tdrl.objectives.dqn import make_dqn_loss
    from tdrl.objectives.reference import torchrl_dqn_loss
    from tdrl.objectives.update import TargetUpdate, Updater

    n = 64
    td = TensorDict({"observation": torch.randn(n, 4), "action": torch.randint(0, 2, (n,)),
                     ("next", "observation"): torch.randn(n, 4), ("next", "reward"): torch.rand(n, 1),
                     ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool)}, [n])
    steps: dict[str, Step] = {}
    makers: tuple[tuple[str, Callable[..., Any]], ...] = (("torchrl", torchrl_dqn_loss), ("tdrl", make_dqn_loss))
    for name, make_loss in makers:
        actor = make_q_actor(EnvFactory("CartPole-v1").specs(), hidden_sizes=[256, 256], dueling=True)
        loss = make_loss(actor, double_dqn=True)
        updater = Updater(_adam(actor.parameters()), max_grad_norm=10.0, target_update=TargetUpdate(loss, interval=312))
        steps[name] = _renamed_step(updater, loss, td)
    return steps


def _renamed_step(updater: Any, loss: Any, td: Any) -> Step:
    """An update on ``loss``'s ``"loss"`` under the name the DQN updater reads (``loss_q``)."""
    return lambda: updater.step(loss(td.clone(False)).rename_key_("loss", "loss_q"))


def _sac_step(name: str, td: Any) -> Step:
    """SAC's update on Pendulum samples: TorchRL-sota's (one optimizer on the three terms' sum) or the recipe's
    (the critics first, then the policy and alpha)."""
    from tdrl.envs import EnvFactory
    from tdrl.models.q import make_q_critic, make_tanh_gaussian_actor, make_twin_q
    from tdrl.objectives.reference import torchrl_sac_loss
    from tdrl.objectives.sac import TwinQSACLoss
    from tdrl.objectives.update import TargetUpdate, Updater

    specs = EnvFactory("Pendulum-v1").specs()
    if name == "torchrl":
        critic = make_q_critic(specs)  # the critic first, then the actor: the RNG's order in every row
        loss = torchrl_sac_loss(make_tanh_gaussian_actor(specs), critic, specs.action_spec)
        updater = Updater(_adam(loss.parameters()), target_update=TargetUpdate(loss, interval=1, tau=0.005))
        return _step_on(updater, loss, td)
    critic, actor = make_twin_q(specs), make_tanh_gaussian_actor(specs)
    twin = TwinQSACLoss(actor, critic)
    critic_up = Updater(_adam(critic.parameters()), loss_keys=("loss_qvalue",))
    policy_up = Updater(_adam([*actor.parameters(), twin.log_alpha]), loss_keys=("loss_actor", "loss_alpha"),
                        target_update=TargetUpdate(twin, interval=1, tau=0.005))
    return lambda: (critic_up.step(twin.critic_loss(td)), policy_up.step(twin.actor_loss(td)))


def _td3_step(name: str, td: Any) -> Step:
    """TD3's update on Pendulum samples, TorchRL's loss or tdrl's: the critics every update, the actor every
    second."""
    from tdrl.envs import EnvFactory
    from tdrl.models.q import make_deterministic_actor, make_q_critic, make_twin_q
    from tdrl.objectives.continuous import make_td3_loss
    from tdrl.objectives.reference import torchrl_td3_loss
    from tdrl.objectives.update import TargetUpdate, Updater

    specs = EnvFactory("Pendulum-v1").specs()
    critic = make_twin_q(specs) if name == "tdrl" else make_q_critic(specs)
    make_loss: Callable[..., Any] = make_td3_loss if name == "tdrl" else torchrl_td3_loss
    loss = make_loss(make_deterministic_actor(specs), critic, specs.action_spec)
    trained = [(k, p) for k, p in loss.named_parameters() if p.requires_grad]
    critic_up = Updater(_adam(p for k, p in trained if "qvalue" in k), loss_keys=("loss_qvalue",))
    actor_up = Updater(_adam(p for k, p in trained if "actor" in k), loss_keys=("loss_actor",))
    target = TargetUpdate(loss, interval=1, tau=0.005)

    def step() -> None:
        sample = td.clone(False)
        critic_up.step({"loss_qvalue": loss.value_loss(sample)[0]})
        if critic_up.updates % 2 == 0:
            actor_up.step({"loss_actor": loss.actor_loss(sample)[0]})
        target.step()

    return step


LEARN_FROM = 100  # --iteration: off-policy recipes update from this frame on (optim.min_steps_learn)
KEEP_OWN_LOSS = 1.2  # tdrl keeps its own loss for an algorithm only if the whole iteration is this much faster
# the recipes that run tdrl's own loss (TorchRL's is its oracle); DDPG left on 2026-11-26 (docs/learning.md#losses)
LOSS_ALGOS = ("ppo", "dqn", "sac", "td3")


def bench_losses(algos: list[str], threads: int | None = None, repeats: int = 100) -> dict[str, dict[str, float]]:
    """Milliseconds per update, TorchRL's loss vs tdrl's own, each as its recipe steps it, on the recipe's thread
    count unless ``threads`` is given (best of 3 interleaved rounds: the machine is shared)."""
    out = {}
    print(f"{'update':10s} {'torchrl ms':>11s} {'tdrl ms':>8s} {'speed-up':>9s}")
    for algo in algos:
        torch.set_num_threads(threads or load_recipe(algo).Config().run.torch_threads)
        steps = _update_steps(algo)
        best: dict[str, float] = {}
        for _ in range(3):
            for name, step in steps.items():
                best[name] = min(best.get(name, math.inf), ms_per_call(step, repeats, warmup=10))
        out[algo] = best
        print(f"{algo:10s} {best['torchrl']:11.3f} {best['tdrl']:8.3f} {best['torchrl'] / best['tdrl']:8.2f}x",
              flush=True)
    return out


@contextlib.contextmanager
def torchrl_loss(algo: str) -> Iterator[None]:
    """Run DQN/PPO recipes with TorchRL's loss instead of tdrl's: patches the factory in the module the recipe
    imports it from (inside ``main``, so the patch is seen), and fails if the recipe never called it."""
    from torchrl.objectives import ClipPPOLoss

    import tdrl.objectives.dqn
    import tdrl.objectives.policy_gradient
    from tdrl.objectives.reference import torchrl_dqn_loss

    class RecipeKeysPPO(ClipPPOLoss):  # the recipe keeps loss.in_keys in its minibatches (GAE already ran)
        @property
        def in_keys(self) -> list[str]:
            return ["observation", "action", "action_log_prob", "advantage", "value_target"]

        @in_keys.setter
        def in_keys(self, value: Any) -> None:
            pass

    calls = []

    def make(*args: Any, **kwargs: Any) -> Any:
        calls.append(type(args[0]).__name__)
        if algo == "dqn":
            return torchrl_dqn_loss(*args, **kwargs)
        return RecipeKeysPPO(args[0].actor, args[0].critic, loss_critic_type="l2", **kwargs)

    module, name = ((tdrl.objectives.dqn, "make_dqn_loss") if algo == "dqn"
                    else (tdrl.objectives.policy_gradient, "make_ppo_loss"))
    with mock.patch.object(module, name, make):
        yield
    if not calls:
        raise RuntimeError(f"the {algo} recipe never called {module.__name__}.{name}: the torchrl row would "
                           "measure tdrl's loss")


def bench_iteration(algos: list[str], threads: int | None = None, rounds: int = 3) -> None:
    """Whole recipe iterations (collect, replay, update) at the recipe's defaults, evaluation off, tdrl's own loss vs
    TorchRL's loss, in ms per iteration (best of ``rounds`` interleaved runs). DQN, PPO: both run in the recipe
    (TorchRL's loss takes the recipe's calls). SAC, TD3, DDPG (one update per iteration): the recipe runs with
    tdrl's loss, and TorchRL's figure adds the per-update difference of :func:`bench_losses`."""
    from tdrl.config import apply_overrides

    budgets = {"ppo": 6_400, "dqn": 3_000, "sac": 600, "td3": 1_600}
    # off-policy: updates from the 100th frame, so the iterations measured are the learning ones that fill a real
    # run (a recipe's own min_steps_learn is a few percent of its budget, but most of these short ones)
    per_update = bench_losses([a for a in algos if a in ("sac", "td3")], threads)
    print(f"{'iteration':10s} {'torchrl ms':>11s} {'tdrl ms':>8s} {'tdrl gain':>10s} {'updates/it':>11s}  choice")
    for algo in algos:
        best: dict[str, float] = {}
        updates = 0.0
        for _ in range(rounds):
            for variant in ("tdrl", "torchrl") if algo in ("dqn", "ppo") else ("tdrl",):
                recipe = load_recipe(algo)
                swap = torchrl_loss(algo) if variant == "torchrl" else contextlib.nullcontext()
                with swap, tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
                    start = CLOCK()
                    summary = recipe.main(apply_overrides(recipe.Config(), [
                        f"collector.total_frames={budgets[algo]}", f"run.root={tmp}", "eval.n_envs=0",
                        *([f"optim.min_steps_learn={LEARN_FROM}"] if algo != "ppo" else []),
                        "logger.wandb=false", "logger.progress_bar=false", "checkpoint.snapshot_mode=none",
                        f"logger.log_interval_steps={budgets[algo]}",
                        *([f"run.torch_threads={threads}"] if threads else [])]))
                    seconds = CLOCK() - start  # the whole run: start-up included, the same for both losses
                best[variant] = min(best.get(variant, math.inf), seconds / summary["iterations"] * 1e3)
                updates = summary["updates"] / summary["iterations"]
        if "torchrl" not in best:
            best["torchrl"] = best["tdrl"] + updates * (per_update[algo]["torchrl"] - per_update[algo]["tdrl"])
        gain = best["torchrl"] / best["tdrl"]
        print(f"{algo:10s} {best['torchrl']:11.3f} {best['tdrl']:8.3f} {gain - 1:10.0%} {updates:11.2f}  "
              f"{'tdrl' if gain >= KEEP_OWN_LOSS else 'torchrl'}", flush=True)
    print(f"(choice: tdrl's own loss where it makes the whole iteration >= {KEEP_OWN_LOSS}x faster, else TorchRL's)")


# --- Report -----------------------------------------------------------------------------------------------------


def to_threshold(curve: list[dict[str, float]], threshold: float) -> tuple[float, float]:
    """``(frames, train_s)`` at the first evaluation reaching ``threshold`` (nan, nan if never)."""
    for point in curve:
        if point["return_mean"] >= threshold:
            return float(point["frames"]), float(point["train_s"])
    return math.nan, math.nan


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if len(finite) == len(values) and finite else math.nan


def _parser() -> argparse.ArgumentParser:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--tasks", default="", help="comma-separated task names (default: the default set): "
                        + ", ".join(t.name for t in TASKS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--no-sb3", action="store_true", help="skip the SB3 baselines")
    parser.add_argument("--stop", action="store_true",
                        help="stop each run at the threshold (frames/time to threshold only; no final return)")
    parser.add_argument("--json", default="", help="write every row to this file")
    parser.add_argument("--rows", nargs="+", default=[], metavar="JSON",
                        help="report the rows of earlier runs' --json files instead of running (e.g. runs made side "
                             "by side, one per core)")
    parser.add_argument("--runs", nargs="+", default=[], metavar="DIR|CSV",
                        help="report the runs of a learning_run.py sweep (e.g. runs/sweeps/mujoco_offpolicy, or the "
                             "CSV --keep wrote, e.g. docs/data/mujoco_offpolicy.csv): returns with IQM and CI, and "
                             "curves (--plots)")
    parser.add_argument("--plots", default="", metavar="DIR", help="with --runs: write <DIR>/<task>.png")
    parser.add_argument("--keep", default="", metavar="DIR",
                        help="with --runs: write every finished run's evaluations (task, impl, seed, frames, train "
                             "seconds, return) to DIR/<sweep>.csv, e.g. docs/data, to commit")
    parser.add_argument("--unpack", default="", metavar="DIR",
                        help="with --runs CSV: write its runs' files (variant.json, progress.csv, summary.json) "
                             "under DIR/<sweep>/, e.g. runs/sweeps, so that relaunching the sweep skips them")
    parser.add_argument("--frames", type=int, default=0, metavar="N",
                        help="env frames per run instead of each task's budget (e.g. to compare the cost per frame)")
    parser.add_argument("--quiet", type=float, default=None, metavar="FRACTION",
                        help="before each run, wait (up to 10 min) until other processes use less than this fraction "
                             "of the machine (/proc/stat; e.g. 0.1): 2-thread updates slow 3-4x on a shared core")
    parser.add_argument("--gae", action="store_true", help="only the GAE micro-benchmark (tdrl vs TorchRL)")
    parser.add_argument("--losses", default="", metavar="ALGOS",
                        help="only the per-update micro-benchmark, TorchRL's loss vs tdrl's own: 'all' or some of "
                        + ",".join(LOSS_ALGOS))
    parser.add_argument("--iteration", default="", metavar="ALGOS",
                        help="only the whole-iteration profile (recipe defaults), TorchRL's loss vs tdrl's own")
    parser.add_argument("--cpu-time", action="store_true",
                        help="--losses/--iteration measure this process's CPU time (serial collectors, one thread)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for --losses/--iteration (default: each recipe's run.torch_threads)")
    return parser


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = _parser()
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.gae or args.losses or args.iteration:
        _micro_benchmarks(args)
        return []
    names = [n for n in args.tasks.split(",") if n]
    unknown = set(names) - {t.name for t in TASKS}
    if unknown:
        parser.error(f"unknown task(s) {sorted(unknown)}; choose from {[t.name for t in TASKS]}")
    tasks = [t for t in TASKS if t.name in names] if names else [t for t in TASKS if t.default]
    if args.frames:
        tasks = [dataclasses.replace(t, budget=args.frames) for t in tasks]
    if args.runs:
        return _report_runs(args)
    if args.rows:
        return _report_rows(args.rows)
    return _run_tasks(args, tasks)


def _micro_benchmarks(args: argparse.Namespace) -> None:
    """``--gae``, ``--losses``, ``--iteration``: tdrl's pieces against TorchRL's, in ms."""
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter
    if args.gae:
        bench_gae()
    if args.losses:
        bench_losses(list(LOSS_ALGOS) if args.losses == "all" else args.losses.split(","), args.threads)
    if args.iteration:
        bench_iteration(list(LOSS_ALGOS) if args.iteration == "all" else args.iteration.split(","), args.threads)


def _report_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--runs``: a sweep's runs (directories, or the CSV of ``--keep`` unpacked) as rows, returns, curves."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = [str(unpack_sweep(Path(p), Path(args.unpack or tmp))) if p.endswith(".csv") else p
                 for p in args.runs]
        rows = rows_from_runs(paths)
        for row in rows:
            print_row(row)
        report_returns(rows)
        for path in map(Path, paths):  # a sweep's runs live in runs/sweeps/<sweep file's name>
            if (ROOT / "slurm" / "sweeps" / f"{path.name}.py").exists():
                print(f"{path.name}: run or resume (same directories) with "
                      f"`python slurm/launch.py local slurm/sweeps/{path.name}.py --max-parallel 1`")
        if args.plots:
            plot_runs(paths, Path(args.plots))
        if args.keep:
            keep_results(rows, Path(args.keep))
    return rows


def _report_rows(paths: list[str]) -> list[dict[str, Any]]:
    """``--rows``: the rows of earlier runs' ``--json`` files, reported as one run."""
    rows = [row for path in paths for row in json.loads(Path(path).read_text())]
    for row in rows:
        print_row(row)
    done = [t for t in TASKS if any(r["task"] == t.name for r in rows)]
    report(done, rows)
    print("\nEach task's rows again:")
    for task in done:
        seeds = ",".join(str(r["seed"]) for r in rows if r["task"] == task.name and r["impl"] == "tdrl")
        print(f"  python benchmarks/learning.py --tasks {task.name} --seeds {seeds} --no-sb3")
    return rows


def _run_tasks(args: argparse.Namespace, tasks: list[Task]) -> list[dict[str, Any]]:
    """Each task over the seeds, tdrl and (if installed and not ``--no-sb3``) SB3, one run after the other."""
    seeds = [int(s) for s in args.seeds.split(",")]
    have_sb3 = importlib.util.find_spec("stable_baselines3") is not None and not args.no_sb3
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            impls: list[tuple[str, Callable[[int], list[dict[str, float]]]]] = [
                ("tdrl", functools.partial(_tdrl_curve, task, Path(tmp), args.stop))]
            if have_sb3 and task.sb3 is not None:
                impls.append(("sb3", functools.partial(_sb3_row_curve, task, args.stop)))
            for seed in seeds:
                for impl, fn in impls:
                    rows.append(_one_row(task, impl, seed, fn, args.quiet))
    report(tasks, rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


def _tdrl_curve(task: Task, root: Path, stop: bool, seed: int) -> list[dict[str, float]]:
    return run_tdrl(task, seed, root, stop)


def _sb3_row_curve(task: Task, stop: bool, seed: int) -> list[dict[str, float]]:
    assert task.sb3 is not None
    return task.sb3(seed, task, stop)


def _one_row(task: Task, impl: str, seed: int, fn: Callable[[int], list[dict[str, float]]],
             quiet: float | None) -> dict[str, Any]:
    """One run of ``task`` by ``impl`` with ``seed`` (after waiting for a quiet machine), printed as its row."""
    if quiet is not None and not wait_until_quiet(quiet, 600):
        print(f"  (machine never quiet before {task.name} {impl} seed {seed}; running anyway)")
    torch.manual_seed(seed)
    torch.set_num_threads(DEFAULT_TORCH_THREADS)
    torch.set_flush_denormal(False)  # SB3's arithmetic; a recipe sets its run.flush_denormal
    curve = fn(seed)
    frames, train_s = to_threshold(curve, task.threshold)
    row = {"task": task.name, "impl": impl, "seed": seed, "threshold": task.threshold,
           "frames_to_threshold": frames, "train_s_to_threshold": train_s,
           "final_return": curve[-1]["return_mean"], "final_frames": curve[-1]["frames"],
           "train_s": curve[-1]["train_s"], "curve": curve}
    print_row(row)
    return row


def rows_from_runs(paths: list[str]) -> list[dict[str, Any]]:
    """Rows of ``learning_run.py`` runs (a sweep's run directories below ``paths``): task and implementation from
    each run's ``variant.json``, the seed from its ``run_<seed>`` directory, the curve from its ``progress.csv``.
    A run still going (no ``summary.json``) is included with what it has logged, marked ``done: False``."""
    from tdrl.launch.variants import load_variant
    from tdrl.log.progress import read_progress_floats
    from tdrl.plot import find_runs

    rows = []
    for run_dir in find_runs(paths):
        variant = load_variant(run_dir)
        columns = read_progress_floats(run_dir / "progress.csv")
        curve = [{"frames": int(f), "train_s": t, "return_mean": r}
                 for f, t, r in zip(columns["CumSteps"], columns["time/train_s"], columns["eval/return_mean"],
                                    strict=True) if math.isfinite(r)]
        if not curve:  # started, not evaluated yet
            continue
        task = next(t for t in TASKS if t.name == variant["task"])
        frames, train_s = to_threshold(curve, task.threshold)
        rows.append({"task": task.name, "impl": variant["impl"], "seed": int(run_dir.name.removeprefix("run_")),
                     "threshold": task.threshold, "frames_to_threshold": frames, "train_s_to_threshold": train_s,
                     "final_return": curve[-1]["return_mean"], "final_frames": curve[-1]["frames"],
                     "train_s": curve[-1]["train_s"], "curve": curve, "budget": task.budget, "run_dir": str(run_dir),
                     "done": (run_dir / "summary.json").is_file()})
    return rows


SWEEP_COLUMNS = ("task", "impl", "seed", "CumSteps", "time/train_s", "eval/return_mean")
"""A sweep's CSV (``--keep``): one row per evaluation of a finished run, the cells as its progress.csv holds them."""


def keep_results(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write every finished run's evaluations to ``out/<sweep>.csv`` (:data:`SWEEP_COLUMNS`), one small file per
    sweep to commit: the report and its curves are remade from it (``--runs out/<sweep>.csv``), and unpacked into
    ``runs/sweeps`` (``--unpack``) it makes a relaunch skip those runs. Checkpoints and replays are left out."""
    from tdrl.log.progress import read_progress

    sweeps: dict[str, list[list[str]]] = {}
    for row in sorted((r for r in rows if r["done"]), key=lambda r: (r["task"], r["impl"], r["seed"])):
        run_dir = Path(row["run_dir"])
        _, progress = read_progress(run_dir / "progress.csv")
        lines = sweeps.setdefault(run_dir.parents[2].name, [])  # <sweep>/<task>/<impl>/run_<seed>
        for cells in progress:
            if math.isfinite(float(cells.get("eval/return_mean") or "nan")):
                lines.append([row["task"], row["impl"], str(row["seed"]), *(cells[k] for k in SWEEP_COLUMNS[3:])])
    written = []
    for sweep, lines in sweeps.items():
        out.mkdir(parents=True, exist_ok=True)
        with (out / f"{sweep}.csv").open("w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([list(SWEEP_COLUMNS), *lines])
        written.append(out / f"{sweep}.csv")
        print(f"kept: {out / sweep}.csv ({len({tuple(line[:3]) for line in lines})} runs)")
    return written


def unpack_sweep(path: Path, root: Path) -> Path:
    """The runs of a sweep's CSV (:func:`keep_results`) as run directories ``root/<sweep>/<task>/<impl>/run_<seed>``
    holding ``variant.json``, ``progress.csv`` and ``summary.json`` (a finished run's files); returns
    ``root/<sweep>``."""
    with path.open(newline="") as f:
        lines = list(csv.DictReader(f))
    runs: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for line in lines:
        runs.setdefault((line["task"], line["impl"], line["seed"]), []).append(line)
    for (task, impl, seed), evaluations in runs.items():
        run_dir = root / path.stem / task / impl / f"run_{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "variant.json").write_text(json.dumps({"task": task, "impl": impl}, indent=2) + "\n")
        with (run_dir / "progress.csv").open("w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows(
                [list(SWEEP_COLUMNS[3:]), *([e[k] for k in SWEEP_COLUMNS[3:]] for e in evaluations)])
        last = evaluations[-1]
        (run_dir / "summary.json").write_text(json.dumps({
            "frames": int(float(last["CumSteps"])), "train_s": float(last["time/train_s"]),
            "eval/return_mean": float(last["eval/return_mean"])}, indent=2) + "\n")
    return root / path.stem


def report_returns(rows: list[dict[str, Any]], at_frames: int = 100_000) -> None:
    """Per task and implementation: IQM [95% bootstrap CI] over seeds of the final return and of the return at
    ``at_frames`` (the evaluation at or just before it), and training hours; runs still going are counted apart."""
    from tdrl.plot import iqm_with_ci

    def iqm_ci(values: list[float]) -> str:
        if not values:
            return "-"
        center, low, high = iqm_with_ci(np.asarray(values, dtype=float)[:, None])
        return f"{center[0]:8.0f} [{low[0]:.0f}, {high[0]:.0f}]"

    print(f"\n{'task':22s} {'impl':5s} {'seeds':>5s} {'final return, IQM [CI]':>26s} "
          f"{f'at {at_frames // 1000}k frames':>26s} {'train h':>8s}  running")
    for task in dict.fromkeys(r["task"] for r in rows):
        for impl in ("tdrl", "sb3"):
            done = [r for r in rows if r["task"] == task and r["impl"] == impl and r["done"]]
            going = [r for r in rows if r["task"] == task and r["impl"] == impl and not r["done"]]
            if not done and not going:
                continue
            at = [max((p for p in r["curve"] if p["frames"] <= at_frames), key=lambda p: p["frames"])["return_mean"]
                  for r in done + going if r["curve"][-1]["frames"] >= at_frames]
            hours = np.mean([r["train_s"] for r in done]) / 3600 if done else math.nan
            running = ", ".join(f"seed {r['seed']} at {r['final_frames']:,}" for r in going) or "-"
            print(f"{task:22s} {impl:5s} {len(done):5d} {iqm_ci([r['final_return'] for r in done]):>26s} "
                  f"{iqm_ci(at):>26s} {hours:8.2f}  {running}")
    print("(IQM over seeds, 95% percentile bootstrap CI; 'at' includes runs still going that passed it)")


def plot_runs(paths: list[str], out_dir: Path) -> None:
    """One figure per task with tdrl's and SB3's IQM curves and bands (``tdrl plot``), ``<out_dir>/<task>.png``."""
    from tdrl.plot import plot_learning_curves

    for path in map(Path, paths):
        for task_dir in sorted(d for d in path.iterdir() if d.is_dir() and d.name in {t.name for t in TASKS}):
            with tempfile.TemporaryDirectory() as tmp:
                written = plot_learning_curves([task_dir], metrics=["eval/return_mean"], out_dir=tmp)
                out_dir.mkdir(parents=True, exist_ok=True)
                for png in written:
                    shutil.copyfile(png, out_dir / f"{task_dir.name}.png")
                    print(f"curves: {out_dir / task_dir.name}.png")


def print_row(row: dict[str, Any]) -> None:
    """One run: threshold crossing, final and best evaluation return."""
    best = max(point["return_mean"] for point in row["curve"])
    print(f"{row['task']:16s} {row['impl']:5s} seed {row['seed']}: threshold at {row['frames_to_threshold']:>9,.0f} "
          f"frames, {row['train_s_to_threshold']:7.1f} s; final {row['final_return']:8.1f} at "
          f"{row['final_frames']:,} frames ({row['train_s']:.1f} s); best {best:.1f}", flush=True)


def report(tasks: list[Task], rows: list[dict[str, Any]]) -> None:
    """The table of means over seeds, per task and implementation."""
    print()
    print(f"{'task':16s} {'impl':5s} {'final return':>12s} {'frames to thr':>14s} {'s to thr':>9s} "
          f"{'train s':>8s} {'s ratio tdrl/sb3':>17s}")
    for task in tasks:
        by_impl = {impl: [r for r in rows if r["task"] == task.name and r["impl"] == impl] for impl in ("tdrl", "sb3")}
        secs = {impl: _mean([r["train_s_to_threshold"] for r in rs]) for impl, rs in by_impl.items() if rs}
        for impl, rs in by_impl.items():
            if not rs:
                continue
            ratio = secs["tdrl"] / secs["sb3"] if impl == "tdrl" and "sb3" in secs else math.nan
            print(f"{task.name:16s} {impl:5s} {np.mean([r['final_return'] for r in rs]):12.1f} "
                  f"{_mean([r['frames_to_threshold'] for r in rs]):14,.0f} {secs[impl]:9.1f} "
                  f"{np.mean([r['train_s'] for r in rs]):8.1f} {ratio:17.2f}")
    print("(means over seeds; 'to thr' is nan when a seed never reached the threshold; times exclude evaluation)")


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Learning benchmark"):  # --markdown PAGE#SECTION: into its docs section
        main()
