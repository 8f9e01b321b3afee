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
    python benchmarks/learning.py --gae --losses                                  # micro: tdrl vs TorchRL, ms/call
    python benchmarks/learning.py --sac-loss                                      # micro: SAC update, tdrl/TorchRL/SB3
    python benchmarks/learning.py --dqn-loss                                      # micro: DQN update, tdrl/TorchRL

Run it from a temporary directory (MuJoCo writes MUJOCO_LOG.TXT into the cwd) and when the machine is quiet:
wall-clock numbers on a shared 2-core machine are noisy, so compare the tdrl/SB3 ratio within one run.

Tasks are :class:`Task` rows in :data:`TASKS`; adding a recipe means adding a row (and, optionally, its SB3
baseline function).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("WANDB_MODE", "disabled")
ROOT = Path(__file__).resolve().parents[1]

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from collectors import wait_until_quiet  # noqa: E402  (the collectors benchmark's /proc/stat check)

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
        sb3: ``fn(seed, task, stop) -> curve`` running SB3's implementation, or ``None``.
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
    sb3: Callable[[int, Task, bool], list[dict[str, float]]] | None = None
    default: bool = True


# --- tdrl -------------------------------------------------------------------------------------------------------


def load_recipe(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def run_tdrl(task: Task, seed: int, root: Path, stop: bool = False) -> list[dict[str, float]]:
    from tdrl.config import apply_overrides

    recipe = load_recipe(task.recipe)
    cfg = apply_overrides(recipe.Config(), [
        f"env.id={task.env_id}", f"collector.total_frames={task.budget}", f"run.seed={seed}",
        f"run.root={root}", f"logger.log_interval_steps={task.eval_interval}", f"eval.n_envs={task.eval_episodes}",
        "logger.wandb=false", "logger.progress_bar=false", "checkpoint.snapshot_mode=none",
        *([f"stop_return={task.threshold}"] if stop else []), *task.overrides,
    ])
    return recipe.main(cfg)["curve"]


# --- Stable-Baselines3 ------------------------------------------------------------------------------------------


def _sb3_curve(model: Any, task: Task, seed: int, stop: bool = False) -> list[dict[str, float]]:
    """Train ``model`` for the task's budget, evaluating greedily every ``eval_interval`` frames after an update."""
    import gymnasium as gym
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from tdrl.collect.stepping import env_seed

    train_env = model.get_env()
    # The recipes evaluate with a wait-reset collector seeded run.seed + 10_000: env i is reset with
    # env_seed(seed + 10_000, i) once and then continues its own RNG, one episode per evaluation. SB3 is evaluated
    # on the very same initial states (a fixed eval set for one and fresh states for the other biased the
    # threshold crossing by up to 2 evaluations on Pendulum).
    eval_envs = [gym.make(task.env_id) for _ in range(task.eval_episodes)]
    reset_seeds = [env_seed(seed + 10_000, i) for i in range(task.eval_episodes)]

    def evaluate() -> float:
        obs = np.stack([env.reset(seed=reset_seeds[i])[0] for i, env in enumerate(eval_envs)])
        reset_seeds[:] = [None] * len(reset_seeds)
        active = np.ones(task.eval_episodes, bool)
        ret = np.zeros(task.eval_episodes)
        while active.any():
            live = np.flatnonzero(active)
            model_obs = train_env.normalize_obs(obs[live]) if isinstance(train_env, VecNormalize) else obs[live]
            action, _ = model.predict(model_obs, deterministic=True)  # normalised as in training, if VecNormalize
            for j, i in enumerate(live):  # finished envs are not stepped (no autoreset): their RNG stays in step
                obs[i], reward, term, trunc, _ = eval_envs[i].step(action[j])
                ret[i] += reward
                active[i] = not (term or trunc)
        return float(ret.mean())

    class EvalEvery(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.curve: list[dict[str, float]] = []
            self.eval_s = 0.0
            self.next_eval = 0
            self.start = time.perf_counter()
            self.reached = False

        def _eval_if_due(self) -> None:
            if self.num_timesteps >= self.next_eval:
                t = time.perf_counter()
                ret = evaluate()
                self.eval_s += time.perf_counter() - t
                train_s = time.perf_counter() - self.start - self.eval_s
                self.curve.append({"frames": self.num_timesteps, "train_s": round(train_s, 3), "return_mean": ret})
                self.next_eval = (self.num_timesteps // task.eval_interval + 1) * task.eval_interval
                self.reached = self.reached or ret >= task.threshold

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()
            self._eval_if_due()

        def _on_rollout_start(self) -> None:  # after the previous update, like tdrl's log boundary
            self._eval_if_due()

        def _on_step(self) -> bool:
            return not (stop and self.reached)

        def _on_training_end(self) -> None:
            if not (stop and self.reached):
                self.next_eval = 0
                self._eval_if_due()

    callback = EvalEvery()
    model.learn(total_timesteps=task.budget, callback=callback)
    for env in eval_envs:
        env.close()
    return callback.curve


def sb3_ppo_cartpole(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    """RL-Zoo ppo.yml CartPole-v1: 8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, lambda 0.8, linear lr/clip."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(task.env_id, n_envs=8, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
                learning_rate=lambda p: 1e-3 * p, clip_range=lambda p: 0.2 * p, seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop)


def sb3_a2c_cartpole(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    """RL-Zoo a2c.yml CartPole-v1: 8 envs, ent_coef 0 (SB3 defaults otherwise: n_steps 5, lr 7e-4, RMSprop)."""
    from stable_baselines3 import A2C
    from stable_baselines3.common.env_util import make_vec_env

    env = make_vec_env(task.env_id, n_envs=8, seed=seed)
    model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop)


def sb3_ppo_halfcheetah(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    """RL-Zoo ppo.yml HalfCheetah (v4 hyperparameters) with VecNormalize."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env(task.env_id, n_envs=1, seed=seed), gamma=0.99)
    model = PPO("MlpPolicy", env, n_steps=512, batch_size=64, gae_lambda=0.92, gamma=0.98, n_epochs=20,
                ent_coef=0.000401762, learning_rate=2.0633e-05, clip_range=0.1, max_grad_norm=0.8, vf_coef=0.58096,
                policy_kwargs=dict(log_std_init=-2, ortho_init=False, activation_fn=torch.nn.ReLU,
                                   net_arch=dict(pi=[256, 256], vf=[256, 256])), seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop)


def sb3_dqn_cartpole(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    """RL-Zoo dqn.yml CartPole-v1: lr 2.3e-3, batch 64, buffer 100k, start 1000, train_freq 256 with 128 gradient
    steps, target update 10, exploration 16 % of the budget to 0.04, net [256, 256]."""
    from stable_baselines3 import DQN

    model = DQN("MlpPolicy", task.env_id, learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
                learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
                exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
                seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop)


def sb3_sac_pendulum(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    """RL-Zoo sac.yml Pendulum-v1: lr 1e-3 (SB3 defaults otherwise: [256, 256], batch 256, start 100, one update
    per step, tau 0.005, automatic entropy)."""
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", task.env_id, learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop)


def _sb3_deterministic_pendulum(algo: Any, seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    """RL-Zoo td3.yml / ddpg.yml Pendulum-v1: gamma 0.98, buffer 200k, start 10000, normal noise 0.1, one update per
    step after each episode, lr 1e-3, net [400, 300]."""
    from stable_baselines3.common.noise import NormalActionNoise

    noise = NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1))
    model = algo("MlpPolicy", task.env_id, gamma=0.98, buffer_size=200_000, learning_starts=10_000,
                 action_noise=noise, gradient_steps=-1, train_freq=(1, "episode"), learning_rate=1e-3,
                 policy_kwargs=dict(net_arch=[400, 300]), seed=seed, device="cpu", verbose=0)
    return _sb3_curve(model, task, seed, stop)


def sb3_td3_pendulum(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    from stable_baselines3 import TD3

    return _sb3_deterministic_pendulum(TD3, seed, task, stop)


def sb3_ddpg_pendulum(seed: int, task: Task, stop: bool = False) -> list[dict[str, float]]:
    from stable_baselines3 import DDPG

    return _sb3_deterministic_pendulum(DDPG, seed, task, stop)


# --- Tasks ------------------------------------------------------------------------------------------------------

TASKS: list[Task] = [
    Task("ppo-cartpole", "ppo", "CartPole-v1", threshold=475, budget=100_000, eval_interval=5_000,
         sb3=sb3_ppo_cartpole),
    Task("a2c-cartpole", "a2c", "CartPole-v1", threshold=475, budget=500_000, eval_interval=10_000,
         sb3=sb3_a2c_cartpole),
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
    Task("ppo-halfcheetah", "ppo", "HalfCheetah-v5", threshold=1500, budget=1_000_000, eval_interval=25_000,
         eval_episodes=5, default=False, sb3=sb3_ppo_halfcheetah,
         # RL-Zoo's HalfCheetah PPO hyperparameters (1 env x 512 steps, 20 epochs of 64-sample minibatches, ReLU
         # 256x256, log-std -2, lr 2e-5, clip 0.1); observations normalised in the model, rewards scaled by 0.1
         overrides=["collector.batch_B=1", "collector.batch_T=512", "model.hidden_sizes=[256,256]",
                    "model.activation=relu", "model.init_log_std=-2", "model.distribution=normal",
                    "model.normalize_observation=true", "loss.gamma=0.98", "loss.gae_lambda=0.92", "loss.epochs=20",
                    "loss.minibatches=8", "loss.clip_epsilon=0.1", "loss.linear_decay=false", "optim.lr=2e-5",
                    "optim.max_grad_norm=0.8", "loss.value_loss_coeff=1.16", "loss.entropy_coeff=0.0004",
                    "loss.reward_scale=0.1"]),
]


# --- GAE micro-benchmark ------------------------------------------------------------------------------------------


def ms_per_call(fn: Callable[[], Any], repeats: int, warmup: int) -> float:
    """Milliseconds per call of ``fn`` over ``repeats`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


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


def bench_losses(repeats: int = 200) -> None:
    """One full update (loss, backward, clip, Adam) on 256 CartPole samples: TorchRL's losses vs tdrl's."""
    from tensordict import TensorDict
    from torchrl.objectives import A2CLoss, ClipPPOLoss

    from tdrl.envs import EnvFactory
    from tdrl.models import make_actor_critic
    from tdrl.objectives.policy_gradient import ActorCriticLoss
    from tdrl.objectives.update import Updater

    ac = make_actor_critic(EnvFactory("CartPole-v1").specs())
    td = TensorDict({"observation": torch.randn(256, 4)}, [256])
    with torch.no_grad():
        ac.actor(td)
    td["advantage"], td["value_target"] = torch.randn(256, 1), torch.randn(256, 1)
    losses = {
        "ppo torchrl": ClipPPOLoss(ac.actor, ac.critic, clip_epsilon=0.2, entropy_coeff=0.0, critic_coeff=0.5,
                                   loss_critic_type="l2", normalize_advantage=True),
        "ppo tdrl": ActorCriticLoss(ac, clip_epsilon=0.2, critic_coeff=0.5, entropy_coeff=0.0,
                                    normalize_advantage=True),
        "a2c torchrl": A2CLoss(ac.actor, ac.critic, entropy_coeff=0.0, critic_coeff=0.5, loss_critic_type="l2"),
        "a2c tdrl": ActorCriticLoss(ac, clip_epsilon=None, critic_coeff=0.5, entropy_coeff=0.0),
    }
    best: dict[str, float] = {}
    for _ in range(3):  # interleaved rounds, best of each: the machine is shared
        for name, loss in losses.items():
            updater = Updater(torch.optim.Adam(ac.parameters(), lr=1e-5), max_grad_norm=0.5)

            def step(updater: Any = updater, loss: Any = loss) -> None:
                updater.step(loss(td))

            best[name] = min(best.get(name, math.inf), ms_per_call(step, repeats, warmup=20))
    print(f"{'update step (256 samples)':28s} {'torchrl ms':>11s} {'tdrl ms':>8s} {'speed-up':>9s}")
    for algo in ("ppo", "a2c"):
        ours, theirs = best[f"{algo} tdrl"], best[f"{algo} torchrl"]
        print(f"{algo:28s} {theirs:11.3f} {ours:8.3f} {theirs / ours:8.2f}x")


def print_update_times(title: str, steps: dict[str, Callable[[], Any]], baseline: str, repeats: int) -> None:
    """Time each update ``repeats`` times in 5 interleaved rounds (best round each: the machine is shared) and print
    milliseconds and the ratio to ``baseline``."""
    best: dict[str, float] = {}
    for _ in range(5):
        for name, step in steps.items():
            best[name] = min(best.get(name, math.inf), ms_per_call(step, repeats, warmup=10))
    print(f"{title:24s} {'ms':>7s} {'vs tdrl':>8s}")
    for name, ms in best.items():
        print(f"{name:24s} {ms:7.2f} {ms / best[baseline]:7.2f}x")


def bench_sac_loss(repeats: int = 100) -> None:
    """One SAC update (256 Pendulum samples, [256, 256] MLPs, Adam, polyak targets): TorchRL's SACLoss (vmapped
    critics, one backward), tdrl's FusedSACLoss as recipes/sac.py steps it (critics, then policy and alpha; fused
    Adam), and SB3's ``SAC.train(gradient_steps=1)`` (which also samples its replay buffer); one torch thread each
    (the micro-benchmarks' setting; the recipe runs two)."""
    from tensordict import TensorDict

    from tdrl.envs import EnvFactory
    from tdrl.models.q import make_q_critic, make_tanh_gaussian_actor, make_twin_q
    from tdrl.objectives.continuous import make_sac_loss
    from tdrl.objectives.sac import FusedSACLoss
    from tdrl.objectives.update import TargetUpdate, Updater

    specs = EnvFactory("Pendulum-v1").specs()
    n = 256
    td = TensorDict({"observation": torch.randn(n, 3), "action": torch.rand(n, 1) * 4 - 2,
                     ("next", "observation"): torch.randn(n, 3), ("next", "reward"): -torch.rand(n, 1) * 16,
                     ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
                     ("next", "done"): torch.zeros(n, 1, dtype=torch.bool)}, [n])

    def torchrl_update() -> Callable[[], Any]:
        loss = make_sac_loss(make_tanh_gaussian_actor(specs), make_q_critic(specs), specs.action_spec)
        updater = Updater(torch.optim.Adam(loss.parameters(), lr=1e-3),
                          target_update=TargetUpdate(loss, interval=1, tau=0.005))
        return lambda: updater.step(loss(td.clone(False)))

    def fused_update() -> Callable[[], Any]:
        critic = make_twin_q(specs)
        loss = FusedSACLoss(make_tanh_gaussian_actor(specs), critic)
        critic_params = list(critic.parameters())
        policy_params = [p for p in loss.parameters() if all(p is not q for q in critic_params)]
        critic_updater = Updater(torch.optim.Adam(critic_params, lr=1e-3, fused=True), loss_keys=("loss_qvalue",))
        policy_updater = Updater(torch.optim.Adam(policy_params, lr=1e-3, fused=True),
                                 loss_keys=("loss_actor", "loss_alpha"),
                                 target_update=TargetUpdate(loss, interval=1, tau=0.005))

        def step() -> None:
            critic_updater.step(loss.critic_loss(td))
            policy_updater.step(loss.actor_loss(td))

        return step

    steps = {"torchrl SACLoss": torchrl_update(), "tdrl FusedSACLoss": fused_update()}
    if importlib.util.find_spec("stable_baselines3") is not None:
        from stable_baselines3 import SAC

        sb3 = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, learning_starts=0, device="cpu", verbose=0)
        sb3.learn(300)  # fills its buffer
        steps["sb3 SAC.train"] = lambda: sb3.train(gradient_steps=1, batch_size=n)
    print_update_times("SAC update (256 samples)", steps, "tdrl FusedSACLoss", repeats)


def bench_dqn_loss(repeats: int = 300) -> None:
    """One double-DQN update (64 CartPole samples, dueling [256, 256], Huber, fused Adam): TorchRL's ``DQNLoss``
    against tdrl's ``FusedDQNLoss`` (equal values and gradients, tests/objectives/test_dqn_loss.py)."""
    from tensordict import TensorDict

    from tdrl.envs import EnvFactory
    from tdrl.models.q import make_q_actor
    from tdrl.objectives.dqn import make_dqn_loss

    specs = EnvFactory("CartPole-v1").specs()
    n = 64
    td = TensorDict({"observation": torch.randn(n, 4), "action": torch.randint(0, 2, (n,)),
                     ("next", "observation"): torch.randn(n, 4), ("next", "reward"): torch.rand(n, 1),
                     ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
                     ("next", "done"): torch.zeros(n, 1, dtype=torch.bool),
                     "steps_to_next_obs": torch.full((n, 1), 3)}, [n])

    def update(make: Callable[..., Any]) -> Callable[[], Any]:
        loss = make(make_q_actor(specs, hidden_sizes=[256, 256], dueling=True), gamma=0.99, double_dqn=True)
        optimizer = torch.optim.Adam(loss.value_network_params.values(True, True), lr=1e-3, fused=True)

        def step() -> None:
            optimizer.zero_grad()
            loss(td.clone(False))["loss"].backward()
            optimizer.step()

        return step

    steps = {"torchrl DQNLoss": update(functools.partial(make_dqn_loss, fused=False)),
             "tdrl FusedDQNLoss": update(make_dqn_loss)}
    print_update_times("DQN update (64 samples)", steps, "tdrl FusedDQNLoss", repeats)


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


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="", help="comma-separated task names (default: the default set): "
                        + ", ".join(t.name for t in TASKS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--no-sb3", action="store_true", help="skip the SB3 baselines")
    parser.add_argument("--stop", action="store_true",
                        help="stop each run at the threshold (frames/time to threshold only; no final return)")
    parser.add_argument("--json", default="", help="write every row to this file")
    parser.add_argument("--quiet", type=float, default=None, metavar="FRACTION",
                        help="before each run, wait (up to 10 min) until other processes use less than this fraction "
                             "of the machine (/proc/stat; e.g. 0.1): 2-thread updates slow 3-4x on a shared core")
    parser.add_argument("--gae", action="store_true", help="only the GAE micro-benchmark (tdrl vs TorchRL)")
    parser.add_argument("--losses", action="store_true", help="only the PPO/A2C update-step micro-benchmark")
    parser.add_argument("--sac-loss", action="store_true", help="only the SAC update micro-benchmark (vs TorchRL, SB3)")
    parser.add_argument("--dqn-loss", action="store_true", help="only the DQN update micro-benchmark (vs TorchRL)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.gae or args.losses or args.sac_loss or args.dqn_loss:
        if args.gae:
            bench_gae()
        if args.losses:
            bench_losses()
        if args.sac_loss:
            bench_sac_loss()
        if args.dqn_loss:
            bench_dqn_loss()
        return []
    names = [n for n in args.tasks.split(",") if n]
    unknown = set(names) - {t.name for t in TASKS}
    if unknown:
        parser.error(f"unknown task(s) {sorted(unknown)}; choose from {[t.name for t in TASKS]}")
    tasks = [t for t in TASKS if t.name in names] if names else [t for t in TASKS if t.default]
    seeds = [int(s) for s in args.seeds.split(",")]
    have_sb3 = importlib.util.find_spec("stable_baselines3") is not None and not args.no_sb3
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            impls: list[tuple[str, Callable[[int], list[dict[str, float]]]]] = [
                ("tdrl", lambda s, t=task: run_tdrl(t, s, Path(tmp), args.stop))]
            if have_sb3 and task.sb3 is not None:
                impls.append(("sb3", lambda s, t=task: t.sb3(s, t, args.stop)))
            for seed in seeds:
                for impl, fn in impls:
                    if args.quiet is not None and not wait_until_quiet(args.quiet, 600):
                        print(f"  (machine never quiet before {task.name} {impl} seed {seed}; running anyway)")
                    torch.manual_seed(seed)
                    torch.set_num_threads(DEFAULT_TORCH_THREADS)
                    curve = fn(seed)
                    frames, train_s = to_threshold(curve, task.threshold)
                    row = {"task": task.name, "impl": impl, "seed": seed, "threshold": task.threshold,
                           "frames_to_threshold": frames, "train_s_to_threshold": train_s,
                           "final_return": curve[-1]["return_mean"], "final_frames": curve[-1]["frames"],
                           "train_s": curve[-1]["train_s"], "curve": curve}
                    rows.append(row)
                    print(f"{task.name:16s} {impl:5s} seed {seed}: threshold at {frames:>9,.0f} frames, "
                          f"{train_s:7.1f} s; final {row['final_return']:8.1f} at {row['final_frames']:,} frames "
                          f"({row['train_s']:.1f} s)", flush=True)
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
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
