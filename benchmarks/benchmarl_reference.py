"""BenchMARL beside tdrl on PettingZoo MPE simple_spread: MAPPO, IPPO and QMIX, same frames, seeds and settings.

BenchMARL 1.5.2 pins ``torchrl>=0.10,<0.12``, which tdrl's venv cannot hold (torchrl 0.14), so it runs in a venv of
its own (``.benchmarl-venv/`` at the repository root, git-ignored), made and filled on first use: torch (the same
CPU build as tdrl's, default ``2.13.0+cpu``; torchrl 0.11.1 declares ``torch>=2.1``, and a plain
``pip install torch==2.10.0`` takes the CUDA build with ~3 GB of nvidia wheels), then benchmarl 1.5.2, torchrl 0.11.1,
tensordict 0.11.0, pettingzoo[mpe] 1.24.3 (the last PettingZoo with ``pettingzoo.mpe``, which BenchMARL's task loads)
and vmas 1.5.2, with torch held. Each BenchMARL run is a subprocess of that venv's Python running this file with
``--worker``; only there are BenchMARL's modules imported (``importlib``: tdrl's interpreter and mypy never see them).

BenchMARL's task is ``pettingzoo/simple_spread`` at tdrl's env settings (3 agents, 25-step episodes, local ratio
0.5, discrete actions: tdrl's ``mpe2/simple_spread_v3`` defaults), and its algorithm, experiment and model configs
are set from the tdrl recipe's defaults (``recipes/mappo.py``, ``recipes/qmix.py``): :func:`benchmarl_config`.
What BenchMARL's config cannot express is listed in :data:`DIFFERENCES` and printed with every run.

Returns are **summed over the agents** (tdrl's convention, ``recipes/mappo.py``): BenchMARL logs the per-agent mean
(each agent's episode return, averaged over the agents); the worker sums the evaluation rollouts' per-agent rewards
itself, which is that figure times 3, and checks it. ``--tdrl`` also runs tdrl's recipe on the same budget and seeds
through ``benchmarks/learning.py`` (:func:`learning.run_tdrl`), so one command gives both sides.

    python benchmarks/benchmarl_reference.py --frames 6400 --seeds 0 --tdrl               # dry run, both sides
    python benchmarks/benchmarl_reference.py --algorithms mappo,qmix --frames 2000000 --seeds 0,1,2 --tdrl \\
        --csv /tmp/marl.csv --markdown docs/learning.md#multi-agent
    python benchmarks/benchmarl_reference.py --settings                                   # the mapping, no runs

Per run it prints the final evaluation return (10 greedy episodes), frames, training seconds (evaluation
excluded) and wall seconds (the whole run from building it: env, model and evaluation included, interpreter start-up
not); ``--csv`` writes every evaluation in ``learning.py --keep``'s columns plus ``time/wall_s``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".benchmarl-venv"
TORCH = "2.13.0+cpu"
PINS = ("benchmarl==1.5.2", "torchrl==0.11.1", "tensordict==0.11.0", "pettingzoo[mpe]==1.24.3", "vmas==1.5.2")
MARKER = "tdrl-pins.json"  # in the venv: what it was filled with, so a changed pin refills it
RESULT = "BENCHMARL_RESULT "  # the worker's result line on stdout
N_AGENTS = 3
ENV_ID = "mpe2/simple_spread_v3"
COLUMNS = ("task", "impl", "seed", "CumSteps", "time/train_s", "eval/return_mean", "time/wall_s")
"""The CSV: ``learning.py``'s ``SWEEP_COLUMNS`` (one row per evaluation), then the wall seconds so far."""


@dataclass(frozen=True)
class Algorithm:
    """One algorithm on both sides: tdrl's recipe and its overrides, BenchMARL's algorithm config class."""

    recipe: str
    overrides: tuple[str, ...]
    benchmarl: str
    on_policy: bool


ALGORITHMS = {
    "mappo": Algorithm("mappo", ("loss.algorithm=mappo",), "MappoConfig", True),
    "ippo": Algorithm("mappo", ("loss.algorithm=ippo",), "IppoConfig", True),
    "qmix": Algorithm("qmix", ("loss.method=qmix",), "QmixConfig", False),
}

DIFFERENCES = {
    "all": [
        "software: BenchMARL on torchrl 0.11.1 / tensordict 0.11.0 / pettingzoo 1.24.3 (pettingzoo.mpe), tdrl on "
        "torchrl 0.14.1 / tensordict 0.14.3 / mpe2 1.1.1 (MPE's continuation, same scenario); torch 2.13.0+cpu, one "
        "torch thread, on both sides",
        "evaluation: both 10 greedy episodes every eval interval; tdrl's first at 0 frames on envs seeded seed + "
        "10000, BenchMARL's first after its first batch on envs it does not reseed (evaluation_static false)",
        "returns: BenchMARL logs the mean over agents; both columns here are the sum over the 3 agents (x3)",
        "seeds: the same integers, not the same random streams",
    ],
    "mappo": [
        "critic input: BenchMARL's MAPPO critic reads the env's global state (simple_spread's: the agents' "
        "observations concatenated) and outputs one value for all agents; tdrl's reads the group's concatenated "
        "observations through a centralised MultiAgentMLP",
    ],
    "ippo+mappo": [
        "advantages: tdrl normalises them over the batch; BenchMARL does not (normalize_advantage=False, hard-coded)",
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
}


def differences(algorithm: str) -> list[str]:
    """What differs between the two sides for ``algorithm`` beyond :func:`benchmarl_config`'s mapping."""
    groups = ["all", algorithm] + (["ippo+mappo"] if algorithm in ("mappo", "ippo") else [])
    return [line for group in groups for line in DIFFERENCES.get(group, [])]


# --- Settings: tdrl's recipe defaults -> BenchMARL's configs ------------------------------------------------------


def recipe_config(algorithm: str, frames: int, seed: int = 0) -> Any:
    """The tdrl recipe's config for ``algorithm`` at ``frames`` (its defaults otherwise)."""
    from tdrl.config import apply_overrides
    from tdrl.utils.scripts import load_module

    algo = ALGORITHMS[algorithm]
    recipe = load_module(f"_recipe_{algo.recipe}", ROOT / "recipes" / f"{algo.recipe}.py")
    return apply_overrides(recipe.Config(), [*algo.overrides, f"collector.total_frames={frames}",
                                             f"run.seed={seed}"])


def batch_frames(cfg: Any) -> int:
    return int(cfg.collector.batch_B * cfg.collector.batch_T)


def benchmarl_config(algorithm: str, cfg: Any, frames: int, eval_interval: int) -> dict[str, dict[str, Any]]:
    """BenchMARL's ``experiment``, ``algorithm``, ``task`` and ``model`` settings for the tdrl recipe config ``cfg``
    (``{field: value}`` set on BenchMARL's YAML defaults)."""
    per_batch = batch_frames(cfg)
    if frames % per_batch or eval_interval % per_batch or frames % eval_interval:
        raise ValueError(f"frames ({frames}) and eval interval ({eval_interval}) must be multiples of the batch "
                         f"({per_batch} frames), frames a multiple of the interval: BenchMARL evaluates only there")
    experiment: dict[str, Any] = {
        "sampling_device": "cpu", "train_device": "cpu", "buffer_device": "cpu",
        "share_policy_params": cfg.model.share_params, "prefer_continuous_actions": False,
        "parallel_collection": False, "gamma": cfg.loss.gamma, "lr": cfg.optim.lr,
        "clip_grad_norm": True, "max_n_iters": None, "max_n_frames": frames,
        "evaluation": True, "render": False, "evaluation_interval": eval_interval,
        "evaluation_episodes": cfg.eval.n_envs, "evaluation_deterministic_actions": True, "evaluation_static": False,
        "loggers": [], "create_json": True, "checkpoint_interval": 0, "checkpoint_at_end": False,
    }
    settings = (_on_policy if ALGORITHMS[algorithm].on_policy else _off_policy)(algorithm, cfg, per_batch)
    experiment.update(settings.pop("experiment"))
    return {"experiment": experiment, **settings,
            "task": {"N": N_AGENTS, "local_ratio": 0.5, "max_cycles": 25},  # mpe2/simple_spread_v3's defaults
            "model": {"num_cells": list(cfg.model.hidden_sizes),  # the recipes' MLPs: MAPPO's Tanh, QMIX's ReLU
                      "activation_class": "Tanh" if ALGORITHMS[algorithm].on_policy else "ReLU"}}


def _on_policy(algorithm: str, cfg: Any, per_batch: int) -> dict[str, dict[str, Any]]:
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


def _off_policy(algorithm: str, cfg: Any, per_batch: int) -> dict[str, dict[str, Any]]:
    """recipes/qmix.py: 4 envs x 25 steps, ``replay_ratio`` sampled transitions per collected one, hard target
    copies, epsilon annealed over env frames, Adam at torch's default eps."""
    updates = per_batch * cfg.optim.replay_ratio / cfg.optim.batch_size
    if updates != int(updates):
        raise ValueError(f"replay ratio {cfg.optim.replay_ratio} x {per_batch} frames is no whole number of "
                         f"{cfg.optim.batch_size}-transition updates per batch")
    return {
        "experiment": {"adam_eps": 1e-8, "clip_grad_val": cfg.optim.max_grad_norm,
                       "off_policy_collected_frames_per_batch": per_batch,
                       "off_policy_n_envs_per_worker": cfg.collector.batch_B,
                       "off_policy_n_optimizer_steps": int(updates),
                       "off_policy_train_batch_size": cfg.optim.batch_size,
                       "off_policy_memory_size": cfg.replay.size, "off_policy_init_random_frames": 0,
                       "soft_target_update": cfg.optim.target_update_tau < 1,
                       "hard_target_update_frequency": cfg.optim.target_update_interval,
                       "exploration_eps_init": cfg.exploration.eps_init,
                       "exploration_eps_end": cfg.exploration.eps_final,
                       "exploration_anneal_frames": cfg.exploration.eps_steps},
        "algorithm": {"mixing_embed_dim": cfg.model.mixing_embed_dim, "delay_value": True, "loss_function": "l2"},
    }


# --- The venv --------------------------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_versions(python: Path) -> str:
    """The BenchMARL venv's versions of what matters, as one line."""
    names = ["benchmarl", "torch", "torchrl", "tensordict", "pettingzoo", "vmas"]
    code = f"from importlib.metadata import version; print(', '.join(n + ' ' + version(n) for n in {names!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def ensure_venv(venv: Path, torch: str = TORCH, torch_index_url: str = "",
                run: Callable[..., Any] = subprocess.run) -> Path:
    """``venv``'s Python, the venv made and filled first unless it holds these pins already (its marker file)."""
    wanted = {"torch": torch, "pins": list(PINS)}
    marker = venv / MARKER
    if venv_python(venv).exists() and marker.is_file() and json.loads(marker.read_text()) == wanted:
        return venv_python(venv)
    print(f"making {venv} (torch {torch}, {', '.join(PINS)}): a few minutes", flush=True)
    base = Path(getattr(sys, "_base_executable", sys.executable))
    run([str(base), "-m", "venv", str(venv)], check=True)
    pip = [str(venv_python(venv)), "-m", "pip", "install", "-q"]
    run([*pip, f"torch=={torch}", *(["--index-url", torch_index_url] if torch_index_url else [])], check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as held:
        held.write(f"torch=={torch.split('+')[0]}\n")  # torchvision (BenchMARL's) must not swap torch for CUDA's
    try:
        run([*pip, *PINS], check=True, env={**os.environ, "PIP_CONSTRAINT": held.name})
    finally:
        os.unlink(held.name)
    marker.write_text(json.dumps(wanted))
    return venv_python(venv)


# --- BenchMARL's side (the worker, in the venv) --------------------------------------------------------------------


def run_benchmarl(python: Path, algorithm: str, seed: int, settings: dict[str, dict[str, Any]],
                  threads: int = 1) -> dict[str, Any]:
    """One BenchMARL run in a subprocess of ``python`` (the venv's): its curve, frames, seconds."""
    spec = {"algorithm": algorithm, "seed": seed, "threads": threads, **settings}
    proc = subprocess.run([str(python), __file__, "--worker", json.dumps(spec)], capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"BenchMARL {algorithm} seed {seed} failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1].removeprefix(RESULT)))


def _configs(spec: dict[str, Any]) -> tuple[Any, ...]:
    """BenchMARL's task, algorithm, model and experiment configs: its YAML defaults with ``spec``'s settings."""
    import importlib

    torch = importlib.import_module("torch")
    experiment_cfg = importlib.import_module("benchmarl.experiment").ExperimentConfig.get_from_yaml()
    algorithm_cfg = getattr(importlib.import_module("benchmarl.algorithms"),
                            ALGORITHMS[spec["algorithm"]].benchmarl).get_from_yaml()
    models = importlib.import_module("benchmarl.models")
    task = importlib.import_module("benchmarl.environments").PettingZooTask.SIMPLE_SPREAD.get_from_yaml()
    task.config.update(spec["task"])
    model_cfgs = [models.MlpConfig.get_from_yaml() for _ in range(2)]  # the actor's, the critic's
    for cfg, values in ((experiment_cfg, spec["experiment"]), (algorithm_cfg, spec["algorithm_settings"]),
                        *((m, spec["model"]) for m in model_cfgs)):
        for key, value in values.items():
            if not hasattr(cfg, key):
                raise AttributeError(f"BenchMARL's {type(cfg).__name__} has no {key}")
            setattr(cfg, key, getattr(torch.nn, value) if key == "activation_class" else value)
    return task, algorithm_cfg, model_cfgs, experiment_cfg


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """In the BenchMARL venv: the run ``spec`` describes, each evaluation recorded (return summed over agents)."""
    import importlib

    torch = importlib.import_module("torch")
    torch.set_num_threads(spec["threads"])
    started = time.perf_counter()
    task, algorithm_cfg, (actor_cfg, critic_cfg), experiment_cfg = _configs(spec)
    with tempfile.TemporaryDirectory() as tmp:
        experiment_cfg.save_folder = tmp
        experiment = importlib.import_module("benchmarl.experiment").Experiment(
            task=task, algorithm_config=algorithm_cfg, model_config=actor_cfg, critic_model_config=critic_cfg,
            seed=spec["seed"], config=experiment_cfg)
        curve = _record_evaluations(experiment, started)
        experiment.run()
    return {"curve": curve, "wall_s": time.perf_counter() - started}


def _record_evaluations(experiment: Any, started: float) -> list[dict[str, float]]:
    """Hooks on ``experiment``: each evaluation appends ``{frames, train_s, wall_s, return_mean,
    benchmarl_return}`` to the returned list, ``train_s`` without the evaluations' time."""
    curve: list[dict[str, float]] = []
    clock = {"eval_s": 0.0, "run_start": math.nan}
    evaluate, log_evaluation, run = experiment._evaluation_loop, experiment.logger.log_evaluation, experiment.run

    def timed_run() -> None:
        clock["run_start"] = time.perf_counter()
        run()

    def timed_evaluation() -> None:
        start = time.perf_counter()
        evaluate()
        clock["eval_s"] += time.perf_counter() - start

    def recorded(rollouts: list[Any], total_frames: int, step: int, video_frames: Any = None) -> None:
        log_evaluation(rollouts, total_frames=total_frames, step=step, video_frames=video_frames)  # cuts at done
        groups = list(experiment.group_map)
        summed = [sum(float(r.get(("next", g, "reward")).sum()) for g in groups) for r in rollouts]
        per_agent = [sum(float(r.get(("next", g, "reward")).sum(0).mean()) for g in groups) / len(groups)
                     for r in rollouts]  # BenchMARL's eval/reward/episode_reward
        now = time.perf_counter()
        curve.append({"frames": int(total_frames), "train_s": now - clock["run_start"] - clock["eval_s"],
                      "wall_s": now - started, "return_mean": sum(summed) / len(summed),
                      "benchmarl_return": sum(per_agent) / len(per_agent)})

    experiment._evaluation_loop, experiment.logger.log_evaluation, experiment.run = (timed_evaluation, recorded,
                                                                                     timed_run)
    return curve


# --- tdrl's side ---------------------------------------------------------------------------------------------------


def run_tdrl_recipe(algorithm: str, seed: int, frames: int, eval_interval: int, root: Path) -> dict[str, Any]:
    """tdrl's recipe for ``algorithm`` in this process, through ``learning.py``'s :func:`learning.run_tdrl`."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import learning

    algo = ALGORITHMS[algorithm]
    task = learning.Task(f"simple_spread-{algorithm}", algo.recipe, ENV_ID, threshold=math.inf, budget=frames,
                         overrides=list(algo.overrides), eval_interval=eval_interval, eval_episodes=10)
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the recipe's own lines stay out of the report
        curve = learning.run_tdrl(task, seed, root)
    wall = time.perf_counter() - started
    curve = [{**point, "wall_s": math.nan} for point in curve]  # the recipe's curve has no wall seconds
    curve[-1]["wall_s"] = wall
    return {"curve": curve, "wall_s": wall}


# --- Report --------------------------------------------------------------------------------------------------------


def row(algorithm: str, impl: str, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    """A run as ``learning.py`` reports one: final evaluation return (summed over agents), frames, seconds."""
    last = result["curve"][-1]
    return {"task": f"simple_spread-{algorithm}", "impl": impl, "seed": seed, "final_return": last["return_mean"],
            "final_frames": last["frames"], "train_s": last["train_s"], "wall_s": result["wall_s"],
            "curve": result["curve"]}


def print_row(r: dict[str, Any]) -> None:
    per_agent = r["curve"][-1].get("benchmarl_return")
    logged = f" (BenchMARL logs {per_agent:.1f} per agent)" if per_agent is not None else ""
    print(f"{r['task']:20s} {r['impl']:9s} seed {r['seed']}: final {r['final_return']:8.1f}{logged} at "
          f"{r['final_frames']:,} frames; train {r['train_s']:.1f} s, wall {r['wall_s']:.1f} s", flush=True)


def summarise(rows: list[dict[str, Any]]) -> None:
    """Per task and implementation: the final return's mean (IQM with a 95% bootstrap CI from 3 seeds) and times."""
    print(f"\n{'task':20s} {'impl':9s} {'seeds':>5s} {'final return (summed)':>28s} {'frames':>10s} "
          f"{'train s':>8s} {'wall s':>8s}")
    for task in dict.fromkeys(r["task"] for r in rows):
        for impl in ("benchmarl", "tdrl"):
            runs = [r for r in rows if r["task"] == task and r["impl"] == impl]
            if runs:
                finals = [r["final_return"] for r in runs]
                print(f"{task:20s} {impl:9s} {len(runs):5d} {_center(finals):>28s} "
                      f"{max(r['final_frames'] for r in runs):10,d} {_mean([r['train_s'] for r in runs]):8.1f} "
                      f"{_mean([r['wall_s'] for r in runs]):8.1f}")
    print("(final return: mean over seeds, IQM [95% bootstrap CI] from 3 seeds on; returns summed over the 3 agents; "
          "train s excludes evaluation, wall s is the whole run)")


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _center(values: list[float]) -> str:
    if len(values) < 3:
        return f"{_mean(values):.1f} (mean)"
    import numpy as np

    from tdrl.plot import iqm_with_ci

    center, low, high = iqm_with_ci(np.asarray(values, dtype=float)[:, None])
    return f"{center[0]:.1f} [{low[0]:.1f}, {high[0]:.1f}]"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Every evaluation of every run, one line each (:data:`COLUMNS`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(COLUMNS)
        for r in rows:
            for p in r["curve"]:
                out.writerow([r["task"], r["impl"], r["seed"], p["frames"], repr(float(p["train_s"])),
                              repr(float(p["return_mean"])), repr(float(p["wall_s"]))])
    print(f"wrote {os.path.relpath(path, ROOT) if path.is_relative_to(ROOT) else path}")


def print_settings(algorithms: list[str], frames: int, eval_interval: int | None) -> None:
    """The BenchMARL settings each algorithm gets from tdrl's recipe, and what still differs."""
    for algorithm in algorithms:
        cfg = recipe_config(algorithm, frames)
        settings = benchmarl_config(algorithm, cfg, frames, eval_interval or _default_interval(cfg, frames))
        print(f"{algorithm} (tdrl: recipes/{ALGORITHMS[algorithm].recipe}.py "
              f"{' '.join(ALGORITHMS[algorithm].overrides)}; BenchMARL: {ALGORITHMS[algorithm].benchmarl}):")
        for section, values in settings.items():
            print(f"  {section}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
        for line in differences(algorithm):
            print(f"  differs: {line}")


def _default_interval(cfg: Any, frames: int) -> int:
    """The recipe's log interval, or the budget when that is shorter (a multiple of the batch either way)."""
    per_batch = batch_frames(cfg)
    interval = min(int(cfg.logger.log_interval_steps), frames)
    return max(per_batch, interval // per_batch * per_batch)


# --- Main ----------------------------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    add = parser.add_argument
    add("--algorithms", default="mappo,ippo,qmix", help="comma-separated: " + ", ".join(ALGORITHMS))
    add("--frames", type=int, default=6_400, help="env frames per run (each step of all 3 agents); a multiple of "
        "every algorithm's batch (MAPPO/IPPO 800, QMIX 100)")
    add("--seeds", default="0")
    add("--eval-interval", type=int, default=None,
        help="env frames between evaluations (default: the recipe's log interval, at most the budget)")
    add("--tdrl", action="store_true", help="also run tdrl's recipe on the same budget and seeds")
    add("--no-benchmarl", action="store_true", help="only tdrl's side (with --tdrl)")
    add("--csv", default="", metavar="PATH", help="write every evaluation to this CSV (e.g. under docs/data)")
    add("--settings", action="store_true", help="print the settings mapping and the differences, run none")
    add("--venv", default=str(VENV), help="BenchMARL's venv (made on first use)")
    add("--torch", default=TORCH, help="torch for the venv (the same build as tdrl's is fairest)")
    add("--torch-index-url", default="",
        help="pip index for torch where +cpu builds are not local: https://download.pytorch.org/whl/cpu")
    add("--worker", default="", help=argparse.SUPPRESS)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = make_parser()
    args = p.parse_args(argv)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    unknown = sorted(set(args.algorithms) - set(ALGORITHMS))
    if unknown:
        p.error(f"unknown algorithm(s) {unknown}; choose from {list(ALGORITHMS)}")
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.no_benchmarl and not args.tdrl:
        p.error("--no-benchmarl runs nothing without --tdrl")
    return args


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every algorithm and seed: BenchMARL's run (unless ``--no-benchmarl``), then tdrl's (with ``--tdrl``)."""
    python = None if args.no_benchmarl else ensure_venv(Path(args.venv), args.torch, args.torch_index_url)
    if python is not None:
        print(f"BenchMARL's venv: {venv_versions(python)}")
    print_settings(args.algorithms, args.frames, args.eval_interval)
    print()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in args.algorithms:
            cfg = recipe_config(algorithm, args.frames)
            interval = args.eval_interval or _default_interval(cfg, args.frames)
            settings = benchmarl_config(algorithm, cfg, args.frames, interval)
            settings["algorithm_settings"] = settings.pop("algorithm")
            for seed in args.seeds:
                if python is not None:
                    rows.append(row(algorithm, "benchmarl", seed, run_benchmarl(python, algorithm, seed, settings)))
                    print_row(rows[-1])
                if args.tdrl:
                    result = run_tdrl_recipe(algorithm, seed, args.frames, interval, Path(tmp))
                    rows.append(row(algorithm, "tdrl", seed, result))
                    print_row(rows[-1])
    return rows


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.worker:
        print(RESULT + json.dumps(worker(json.loads(args.worker))), flush=True)
        return []
    sys.path.insert(0, str(ROOT))  # this checkout's tdrl and recipes
    if args.settings:
        print_settings(args.algorithms, args.frames, args.eval_interval)
        return []
    rows = run_all(args)
    summarise(rows)
    if args.csv:
        write_csv(rows, Path(args.csv))
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    if "--worker" in sys.argv:
        main()
    else:
        from report import markdown_page

        with markdown_page("Multi-agent"):  # --markdown PAGE#SECTION, e.g. docs/learning.md#multi-agent
            main()
