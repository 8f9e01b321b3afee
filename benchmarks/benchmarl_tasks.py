"""What ``benchmarks/benchmarl_reference.py`` runs on both sides: the tasks (tdrl's env id and overrides, BenchMARL's
task and its settings), the algorithms (tdrl's recipe, BenchMARL's config class), the mapping of the tdrl recipe's
defaults onto BenchMARL's configs (:func:`benchmarl_config`) and what that mapping cannot express (:data:`DIFFERENCES`).

Task settings are tdrl's: mpe2's ``simple_spread_v3`` defaults (3 agents, 25 steps, local ratio 0.5, discrete
actions) and VMAS's scenario defaults with tdrl's 100-step limit and continuous actions (tdrl's recipes pass no
scenario options), set on BenchMARL's task in place of its YAML's (which differ: :data:`DIFFERENCES`).
Returns are summed over the agents on both sides (tdrl's convention; BenchMARL logs the mean over agents).

No BenchMARL import here, and tdrl's only inside functions: the BenchMARL venv imports this module too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VMAS_STEPS = 100  # tdrl.envs.vmas.DEFAULT_MAX_STEPS, BenchMARL's VMAS tasks' max_steps (a test checks both)


@dataclass(frozen=True)
class Algorithm:
    """One algorithm on both sides: tdrl's recipe and its overrides, BenchMARL's algorithm config class, and the
    recipe's MLP activation (BenchMARL's ``activation_class``)."""

    recipe: str
    overrides: tuple[str, ...]
    benchmarl: str
    on_policy: bool
    activation: str


ALGORITHMS = {
    "mappo": Algorithm("mappo", ("loss.algorithm=mappo",), "MappoConfig", True, "Tanh"),
    "ippo": Algorithm("mappo", ("loss.algorithm=ippo",), "IppoConfig", True, "Tanh"),
    "qmix": Algorithm("qmix", ("loss.method=qmix",), "QmixConfig", False, "ReLU"),
    "masac": Algorithm("maddpg", ("loss.algorithm=masac",), "MasacConfig", False, "Tanh"),
}


@dataclass(frozen=True)
class Task:
    """One env on both sides: tdrl's id and extra overrides, BenchMARL's task (its enum and member) set to
    ``settings`` (tdrl's env settings), and the algorithms the issue compares on it."""

    env_id: str
    benchmarl: tuple[str, str]
    settings: Mapping[str, Any]
    algorithms: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    continuous: bool = False
    n_agents: int = field(init=False)

    def __post_init__(self) -> None:
        agents = next((self.settings[k] for k in ("n_agents", "N", "players") if k in self.settings), 0)
        object.__setattr__(self, "n_agents", int(agents))

    @property
    def family(self) -> str:
        return {"vmas": "vmas", "lbforaging": "lbf"}.get(self.env_id.partition("/")[0], "mpe")


VMAS = ("collector.kind=batched_env",)
VMAS_ON_POLICY = (*VMAS, "collector.batch_B=60", "loss.epochs=3", "loss.minibatches=15")
"""MAPPO/IPPO on VMAS: BenchMARL's VMAS batch (6,000 frames, 45 minibatches of 400 each) as 60 envs x 100 steps in
place of the recipe's MPE batch (8 envs x 100 steps, 4 passes of 800): one batched simulator steps 60 envs about as
fast as 8, so a 3M-frame run takes ~1/7 of the time (and balance learned faster: 116 at 480k frames, seed 0)."""
TASKS = {
    "simple_spread": Task("mpe2/simple_spread_v3", ("PettingZooTask", "SIMPLE_SPREAD"),
                          {"N": 3, "local_ratio": 0.5, "max_cycles": 25}, ("mappo", "ippo", "qmix")),
    # VMAS's scenario defaults (BenchMARL's YAML: 4 agents)
    "balance": Task("vmas/balance", ("VmasTask", "BALANCE"),
                    {"max_steps": VMAS_STEPS, "n_agents": 3, "random_package_pos_on_line": True, "package_mass": 5},
                    ("mappo", "ippo"), VMAS_ON_POLICY, continuous=True),
    # VMAS's defaults (BenchMARL's YAML: 3 agents, shared_rew false)
    "navigation": Task("vmas/navigation", ("VmasTask", "NAVIGATION"),
                       {"max_steps": VMAS_STEPS, "n_agents": 4, "collisions": True, "agents_with_same_goal": 1,
                        "split_goals": False, "observe_all_goals": False, "shared_rew": True, "lidar_range": 0.35,
                        "agent_radius": 0.1}, ("mappo", "ippo"), VMAS_ON_POLICY, continuous=True),
    # VMAS's defaults (BenchMARL's YAML: shared_rew false); 8 envs x 25 steps: a whole number of updates per batch
    "sampling": Task("vmas/sampling", ("VmasTask", "SAMPLING"),
                     {"max_steps": VMAS_STEPS, "n_agents": 3, "shared_rew": True, "n_gaussians": 3, "lidar_range": 0.2,
                      "cov": 0.05, "collisions": True, "spawn_same_pos": False}, ("masac",),
                     (*VMAS, "collector.batch_B=8"), continuous=True),
    # lbforaging's registered settings (2 players, 2 food, cooperative, 50 steps); BenchMARL has no LBF task, so
    # benchmarks/benchmarl_lbf.py gives it one on TorchRL's PettingZoo wrapper
    "foraging": Task("lbforaging/Foraging-8x8-2p-2f-coop-v3", ("LbfTask", "FORAGING"),
                     {"env_id": "Foraging-8x8-2p-2f-coop-v3", "players": 2}, ("ippo", "qmix")),
}

DIFFERENCES = {
    "all": [
        "evaluation: both 10 greedy episodes every eval interval; tdrl's first at 0 frames on envs seeded seed + "
        "10000, BenchMARL's first after its first batch on envs it does not reseed (evaluation_static false)",
        "returns: BenchMARL logs the mean over agents; both columns here are the sum over the agents (tdrl's "
        "convention: BenchMARL's figure times n_agents)",
        "seeds: the same integers, not the same random streams; torch 2.13.0+cpu, one torch thread, on both sides",
    ],
    "mpe": [
        "software: BenchMARL on torchrl 0.11.1 / tensordict 0.11.0 / pettingzoo 1.24.3 (pettingzoo.mpe), tdrl on "
        "torchrl 0.14.1 / tensordict 0.14.3 / mpe2 1.1.1 (MPE's continuation, same scenario)",
    ],
    "vmas": [
        "software: vmas 1.5.2 on both; BenchMARL through torchrl 0.11.1's VmasEnv (clamp_actions), tdrl through "
        "torchrl 0.14.1's VmasWrapper (tdrl.envs.vmas, collector.kind=batched_env)",
        f"time limit: {VMAS_STEPS} steps on both; BenchMARL passes max_steps to VMAS, which ends the episode "
        "*terminated* (no bootstrap from its last state); tdrl's own limit ends it *truncated* (bootstrapped)",
        "task settings: VMAS's scenario defaults (no env.options on tdrl's side) set on BenchMARL's task "
        "in place of its YAML's",
        "group name: BenchMARL's VMAS group is 'agents'; tdrl's MAPPO/IPPO call it 'agent' (group_map=prefix), "
        "MASAC 'agents' (one_group): the same agents in one group either way",
        "evaluation episodes: BenchMARL rolls one batched env of 10 for max_steps and keeps each env's first "
        "episode; tdrl's wait-reset evaluator plays one episode on each of 10 envs",
    ],
    "lbf": [
        "software: lbforaging 2.0.0 on both; BenchMARL through benchmarks/benchmarl_lbf.py (a PettingZoo parallel env "
        "on torchrl 0.11.1's PettingZooWrapper), tdrl through tdrl.envs.marl (TupleAgents, tdrl's worker processes)",
        "time limit: 50 steps on both; lbforaging ends the episode *terminated* (BenchMARL's side: no bootstrap), "
        "tdrl cuts it at the same step as *truncated* (bootstrapped)",
    ],
    "balance": ["task settings: BenchMARL's YAML has 4 agents; both run VMAS's default, 3"],
    "navigation": ["task settings: BenchMARL's YAML has 3 agents with their own rewards (shared_rew false); both run "
                   "VMAS's defaults, 4 agents and a shared reward"],
    "sampling": ["task settings: BenchMARL's YAML gives each agent its own reward (shared_rew false); both run "
                 "VMAS's default, a shared reward",
                 "batch: 8 envs x 25 steps on both; the recipe's 4 envs would make 12.5 updates of 256 per 100-frame "
                 "batch, which BenchMARL cannot run"],
    "mpe+mappo": [
        "critic input: BenchMARL's MAPPO critic reads the env's global state (simple_spread's: the agents' "
        "observations concatenated) and outputs one value for all agents; tdrl's reads the group's concatenated "
        "observations through a centralised MultiAgentMLP",
    ],
    "ippo+mappo": [
        "advantages: tdrl standardises each agent's over the batch (off with loss.normalize_advantage=false); "
        "BenchMARL does not (normalize_advantage=False, hard-coded)",
        "optimizers: BenchMARL has two Adams (actor: objective + entropy; critic: value loss), each clipped to "
        "grad norm 5 on its own; tdrl one Adam over both, one clip over all parameters",
        "entropy: BenchMARL adds it to the objective term; the sum is the same loss",
    ],
    "qmix": [
        "learning starts: BenchMARL updates from its first batch (no min_steps_learn); tdrl from 800 frames",
        "team reward: BenchMARL's QMIX learns the mean of the agents' rewards, tdrl's their sum, standardised by its "
        "running mean and std over the sampled batches (loss.standardise_rewards, EPyMARL's, on by default); "
        "BenchMARL's is not standardised",
        "replay sampling: BenchMARL samples its train batch with replacement from a TensorDict replay; tdrl from "
        "its memmap replay (uniform, with replacement)",
    ],
    "masac": [
        "learning starts: BenchMARL updates from its first batch; tdrl after optim.min_steps_learn (1,000) frames "
        "collected by its initial policy",
        "optimizers: BenchMARL has three Adams (actor, q-values, alpha) each clipped to grad norm 10 on its own, set "
        "here to tdrl's rates (optimizer_lr); tdrl one Adam with a rate per part, one clip over all networks",
        "replay sampling: BenchMARL samples its train batch with replacement from a TensorDict replay; tdrl from "
        "its memmap replay (uniform, with replacement)",
    ],
}


def differences(task: str, algorithm: str) -> list[str]:
    """What differs between the two sides for ``algorithm`` on ``task`` beyond :func:`benchmarl_config`'s mapping."""
    family = TASKS[task].family
    groups = ["all", family, task, algorithm, f"{family}+{algorithm}"]
    groups += ["ippo+mappo"] if algorithm in ("mappo", "ippo") else []
    return [line for group in groups for line in DIFFERENCES.get(group, [])]


def pairs(tasks: list[str], algorithms: list[str]) -> list[tuple[str, str]]:
    """The (task, algorithm) runs: each task's algorithms that ``algorithms`` names, in the tasks' order."""
    return [(t, a) for t in tasks for a in TASKS[t].algorithms if a in algorithms]


# --- Settings: tdrl's recipe defaults -> BenchMARL's configs ------------------------------------------------------


def run_settings(task: str, algorithm: str, frames: int, eval_interval: int | None) -> dict[str, dict[str, Any]]:
    """BenchMARL's settings for ``algorithm`` on ``task`` from the tdrl recipe's defaults at ``frames``."""
    cfg = recipe_config(task, algorithm, frames)
    return benchmarl_config(task, algorithm, cfg, frames, eval_interval or default_interval(cfg, frames))


def print_settings(runs: list[tuple[str, str]], frames: int, eval_interval: int | None) -> None:
    """The BenchMARL settings each run gets from tdrl's recipe, and what still differs."""
    for task, algorithm in runs:
        settings = run_settings(task, algorithm, frames, eval_interval)
        algo = ALGORITHMS[algorithm]
        tdrl = " ".join([*algo.overrides, f"env.id={TASKS[task].env_id}", *TASKS[task].overrides])
        print(f"{task}-{algorithm} (tdrl: recipes/{algo.recipe}.py {tdrl}; BenchMARL: "
              f"{'.'.join(TASKS[task].benchmarl)}, {algo.benchmarl}):")
        for section, values in filter(lambda item: item[1], settings.items()):
            print(f"  {section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
        for line in differences(task, algorithm):
            print(f"  differs: {line}")


def load_recipe(algorithm: str) -> Any:
    from tdrl.utils.scripts import load_module

    name = ALGORITHMS[algorithm].recipe
    return load_module(f"_recipe_{name}", ROOT / "recipes" / f"{name}.py")


def recipe_config(task: str, algorithm: str, frames: int, seed: int = 0) -> Any:
    """The tdrl recipe's config for ``algorithm`` on ``task`` at ``frames`` (its defaults otherwise)."""
    from tdrl.config import apply_overrides

    overrides = [*ALGORITHMS[algorithm].overrides, f"env.id={TASKS[task].env_id}", *TASKS[task].overrides]
    return apply_overrides(load_recipe(algorithm).Config(),
                           [*overrides, f"collector.total_frames={frames}", f"run.seed={seed}"])


def batch_frames(cfg: Any) -> int:
    return int(cfg.collector.batch_B * cfg.collector.batch_T)


def default_interval(cfg: Any, frames: int) -> int:
    """The recipe's log interval, or the budget when that is shorter (a multiple of the batch either way)."""
    per_batch = batch_frames(cfg)
    interval = min(int(cfg.logger.log_interval_steps), frames)
    return max(per_batch, interval // per_batch * per_batch)


def benchmarl_config(task: str, algorithm: str, cfg: Any, frames: int, eval_interval: int
                     ) -> dict[str, dict[str, Any]]:
    """BenchMARL's ``experiment``, ``algorithm``, ``task`` and ``model`` settings for the tdrl recipe config ``cfg``
    (``{field: value}`` set on BenchMARL's YAML defaults), and ``optimizer_lr`` (per loss, set on its Adams)."""
    per_batch = batch_frames(cfg)
    if frames % per_batch or eval_interval % per_batch or frames % eval_interval:
        raise ValueError(f"frames ({frames}) and eval interval ({eval_interval}) must be multiples of the batch "
                         f"({per_batch} frames), frames a multiple of the interval: BenchMARL evaluates only there")
    experiment: dict[str, Any] = {
        "sampling_device": "cpu", "train_device": "cpu", "buffer_device": "cpu",
        "share_policy_params": cfg.model.share_params, "prefer_continuous_actions": TASKS[task].continuous,
        "parallel_collection": False, "gamma": cfg.loss.gamma, "lr": _lr(cfg.optim),
        "clip_grad_norm": True, "max_n_iters": None, "max_n_frames": frames,
        "evaluation": True, "render": False, "evaluation_interval": eval_interval,
        "evaluation_episodes": cfg.eval.n_envs, "evaluation_deterministic_actions": True, "evaluation_static": False,
        "loggers": [], "create_json": True, "checkpoint_interval": 0, "checkpoint_at_end": False,
    }
    settings = _SETTINGS[algorithm](cfg, per_batch)
    experiment.update(settings.pop("experiment"))
    return {"experiment": experiment, "algorithm": settings.pop("algorithm"), "task": dict(TASKS[task].settings),
            "model": {"num_cells": list(cfg.model.hidden_sizes), "activation_class": ALGORITHMS[algorithm].activation},
            "optimizer_lr": settings.pop("optimizer_lr", {})}


def _lr(optim: Any) -> float:
    return float(getattr(optim, "lr", getattr(optim, "critic_lr", 0.0)))


def _on_policy(cfg: Any, per_batch: int) -> dict[str, dict[str, Any]]:
    """recipes/mappo.py: 8 envs x 100 steps, ``epochs`` passes of ``minibatches`` minibatches, Adam eps, clip."""
    return {
        "experiment": {"adam_eps": cfg.optim.eps, "clip_grad_val": cfg.optim.max_grad_norm,
                       "on_policy_collected_frames_per_batch": per_batch,
                       "on_policy_n_envs_per_worker": cfg.collector.batch_B,
                       "on_policy_n_minibatch_iters": cfg.loss.epochs,
                       "on_policy_minibatch_size": per_batch // cfg.loss.minibatches},
        "algorithm": {"share_param_critic": cfg.model.share_params, "clip_epsilon": cfg.loss.clip_epsilon,
                      "entropy_coef": cfg.loss.entropy_coeff, "critic_coef": cfg.loss.value_loss_coeff,
                      "loss_critic_type": "smooth_l1",  # TorchRL's MAPPOLoss/IPPOLoss default, which tdrl keeps
                      "lmbda": cfg.loss.gae_lambda, "minibatch_advantage": False},
    }


def _replay(cfg: Any, per_batch: int) -> dict[str, Any]:
    """The off-policy recipes' replay: ``replay_ratio`` sampled transitions per collected one, as BenchMARL's whole
    number of ``batch_size`` updates per batch, from its first batch; Adam at torch's default eps."""
    updates = per_batch * cfg.optim.replay_ratio / cfg.optim.batch_size
    if updates != int(updates):
        raise ValueError(f"replay ratio {cfg.optim.replay_ratio} x {per_batch} frames is no whole number of "
                         f"{cfg.optim.batch_size}-transition updates per batch")
    return {"adam_eps": 1e-8, "clip_grad_val": cfg.optim.max_grad_norm,
            "off_policy_collected_frames_per_batch": per_batch, "off_policy_n_envs_per_worker": cfg.collector.batch_B,
            "off_policy_n_optimizer_steps": int(updates), "off_policy_train_batch_size": cfg.optim.batch_size,
            "off_policy_memory_size": cfg.replay.size, "off_policy_init_random_frames": 0}


def _qmix(cfg: Any, per_batch: int) -> dict[str, dict[str, Any]]:
    """recipes/qmix.py: 4 envs x 25 steps, hard target copies, epsilon annealed over env frames."""
    return {
        "experiment": {**_replay(cfg, per_batch), "soft_target_update": cfg.optim.target_update_tau < 1,
                       "hard_target_update_frequency": cfg.optim.target_update_interval,
                       "exploration_eps_init": cfg.exploration.eps_init,
                       "exploration_eps_end": cfg.exploration.eps_final,
                       "exploration_anneal_frames": cfg.exploration.eps_steps},
        "algorithm": {"mixing_embed_dim": cfg.model.mixing_embed_dim, "delay_value": True, "loss_function": "l2"},
    }


def _masac(cfg: Any, per_batch: int) -> dict[str, dict[str, Any]]:
    """recipes/maddpg.py loss.algorithm=masac: polyak targets every update, twin critics, a learned temperature
    towards the recipe's target entropy, a rate for the actors (and alpha) and one for the critics."""
    if cfg.optim.target_update_interval != 1:
        raise ValueError("BenchMARL's soft target update runs every update: optim.target_update_interval must be 1")
    return {
        "experiment": {**_replay(cfg, per_batch), "soft_target_update": True,
                       "polyak_tau": cfg.optim.target_update_tau},
        "algorithm": {"share_param_critic": cfg.model.share_critic_params, "num_qvalue_nets": 2, "loss_function": "l2",
                      "delay_qvalue": True, "target_entropy": masac_target_entropy(cfg),
                      "alpha_init": cfg.loss.alpha_init, "fixed_alpha": cfg.loss.fixed_alpha, "use_tanh_normal": True},
        "optimizer_lr": {"loss_actor": cfg.optim.actor_lr, "loss_alpha": cfg.optim.actor_lr,
                         "loss_qvalue": cfg.optim.critic_lr},
    }


_SETTINGS = {"mappo": _on_policy, "ippo": _on_policy, "qmix": _qmix, "masac": _masac}


def masac_target_entropy(cfg: Any) -> float:
    """The per-agent entropy target recipes/maddpg.py's SACLoss gets for ``cfg`` (its loss, built on the env's
    specs: BenchMARL's ``"auto"`` would count the action box's units, not its [-1, 1]-rescaled width)."""
    from tdrl.envs import EnvFactory

    recipe = load_recipe("masac")
    specs = EnvFactory(cfg.env.id, {"group_map": "one_group", "continuous_actions": True}).specs()
    obs, action = specs.observation_spec[recipe.GROUP, "observation"], specs.action_spec[recipe.GROUP, "action"]
    visible = recipe.visible_agents(cfg.model.critic_visible_agents, action.shape[0])
    loss = recipe.group_loss(cfg, recipe.group_actor(obs, action, cfg.model, True),
                             recipe.group_critic(obs, action, visible, cfg.model), action)
    return round(float(loss.target_entropy), 6)


def worker_spec(task: str, algorithm: str, seed: int, settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the worker needs for one run: BenchMARL's task and algorithm classes, the settings, the seed."""
    return {"name": f"{task}-{algorithm}", "seed": seed, "threads": 1, "benchmarl_task": list(TASKS[task].benchmarl),
            "benchmarl_algorithm": ALGORITHMS[algorithm].benchmarl, "experiment": settings["experiment"],
            "algorithm_settings": settings["algorithm"], "task": settings["task"], "model": settings["model"],
            "optimizer_lr": settings["optimizer_lr"]}
