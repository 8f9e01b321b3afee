"""BenchMARL beside tdrl, one command for both sides: MPE simple_spread (MAPPO, IPPO, QMIX), VMAS balance and
navigation (MAPPO, IPPO) and VMAS sampling (MASAC), same task settings, frames, envs, seeds and algorithm settings.

BenchMARL 1.5.2 pins ``torchrl>=0.10,<0.12``, which tdrl's venv cannot hold (torchrl 0.14), so it runs in a venv of
its own (``.benchmarl-venv/`` at the repository root, git-ignored), made and filled on first use: torch (the same
CPU build as tdrl's, default ``2.13.0+cpu``; torchrl 0.11.1 declares ``torch>=2.1``, and a plain
``pip install torch==2.10.0`` takes the CUDA build with ~3 GB of nvidia wheels), then benchmarl 1.5.2, torchrl 0.11.1,
tensordict 0.11.0, pettingzoo[mpe] 1.24.3 (the last PettingZoo with ``pettingzoo.mpe``, which BenchMARL's task loads)
and vmas 1.5.2, with torch held. Each BenchMARL run is a subprocess of that venv's Python running this file with
``--worker``; only there are BenchMARL's modules imported (``importlib``: tdrl's interpreter and mypy never see them).

The tasks, the algorithms and the mapping of tdrl's recipe defaults onto BenchMARL's configs are in
``benchmarks/benchmarl_tasks.py``: task settings are tdrl's (mpe2's simple_spread defaults; VMAS's scenario defaults,
100-step episodes, continuous actions), set on BenchMARL's task; frames per batch, envs, lr, gamma, ... come from the
recipe's defaults; what BenchMARL's config cannot express is listed (``DIFFERENCES``) and printed with every run.

Returns are **summed over the agents** (tdrl's convention, ``recipes/mappo.py``): BenchMARL logs the per-agent mean
(each agent's episode return, averaged over the agents); the worker sums the evaluation rollouts' per-agent rewards
itself (that figure times n_agents; both are printed). ``--tdrl`` also runs tdrl's recipe on the same budget and seeds
through ``benchmarks/learning.py`` (:func:`learning.run_tdrl`), so one command gives both sides.

    python benchmarks/benchmarl_reference.py --frames 12000 --seeds 0 --tdrl              # dry run, every task
    python benchmarks/benchmarl_reference.py --tasks balance,navigation --frames 3000000 --seeds 0,1,2 --tdrl \\
        --results ~/marl --jobs 2 --csv docs/data/marl_vmas.csv     # the VMAS study: ~2.5 h on 2 cores
    python benchmarks/benchmarl_reference.py --settings --tasks sampling                  # the mapping, no runs

Per run it prints the final evaluation return (10 greedy episodes), frames, training seconds (evaluation
excluded) and wall seconds (the whole run from building it: env, model and evaluation included; interpreter start-up
and library imports not); at the end, per task and algorithm, both sides' final-return IQM with a 95% bootstrap CI
over seeds (``tdrl.plot.iqm_with_ci``) and their seconds side by side. ``--csv`` writes every evaluation in
``learning.py --keep``'s columns plus ``time/wall_s``.

Every run is a subprocess (BenchMARL's in its venv, tdrl's in this interpreter), ``--jobs`` at a time. With
``--results DIR`` each run lives in ``DIR/<task>-<algorithm>/<side>-seed<k>/`` and checkpoints at every evaluation
(tdrl's bitwise; BenchMARL's own, which hold no optimizer or RNG state): rerunning the same command resumes the
unfinished runs and reports the finished ones without running them, so a study longer than a session spans several.
A resumed run's seconds are those up to its last checkpoint plus its last attempt's (the rows say which resumed).
The kept runs are runs ``tdrl plot`` draws (BenchMARL's with a ``progress.csv`` of its evaluations), and ``--plot
DIR`` writes each task and algorithm's figure: both sides' IQM curves with 95% bands over seeds.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmarl_tasks import (  # noqa: E402
    ALGORITHMS,
    TASKS,
    pairs,
    print_settings,
    run_settings,
    worker_spec,
)

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".benchmarl-venv"
TORCH = "2.13.0+cpu"
PINS = ("benchmarl==1.5.2", "torchrl==0.11.1", "tensordict==0.11.0", "pettingzoo[mpe]==1.24.3", "vmas==1.5.2",
        "lbforaging==2.0.0")
MARKER = "tdrl-pins.json"  # in the venv: what it was filled with, so a changed pin refills it
RESULT = "BENCHMARL_RESULT "  # the worker's result line on stdout
COLUMNS = ("task", "impl", "seed", "CumSteps", "time/train_s", "eval/return_mean", "time/wall_s")
"""The CSV: ``learning.py``'s ``SWEEP_COLUMNS`` (one row per evaluation; task is ``<task>-<algorithm>``), then the
wall seconds so far."""


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


def _configs(spec: dict[str, Any]) -> tuple[Any, ...]:
    """BenchMARL's task, algorithm, model and experiment configs: its YAML defaults with ``spec``'s settings."""
    import importlib

    torch = importlib.import_module("torch")
    experiment_cfg = importlib.import_module("benchmarl.experiment").ExperimentConfig.get_from_yaml()
    algorithms = importlib.import_module("benchmarl.algorithms")
    algorithm_cfg = getattr(algorithms, spec["benchmarl_algorithm"]).get_from_yaml()
    models = importlib.import_module("benchmarl.models")
    task_enum, member = spec["benchmarl_task"]
    if task_enum == "LbfTask":  # not one of BenchMARL's: benchmarks/benchmarl_lbf.py
        task = getattr(importlib.import_module("benchmarl_lbf").LbfTask, member).get_task(dict(spec["task"]))
    else:
        task = getattr(getattr(importlib.import_module("benchmarl.environments"), task_enum), member).get_from_yaml()
        task.config.update(spec["task"])
    model_cfgs = [models.MlpConfig.get_from_yaml() for _ in range(2)]  # the actor's, the critic's
    for cfg, values in ((experiment_cfg, spec["experiment"]), (algorithm_cfg, spec["algorithm_settings"]),
                        *((m, spec["model"]) for m in model_cfgs)):
        for key, value in values.items():
            if not hasattr(cfg, key):
                raise AttributeError(f"BenchMARL's {type(cfg).__name__} has no {key}")
            setattr(cfg, key, getattr(torch.nn, value) if key == "activation_class" else value)
    return task, algorithm_cfg, model_cfgs, experiment_cfg


def set_learning_rates(optimizers: dict[str, dict[str, Any]], rates: dict[str, float]) -> None:
    """BenchMARL's Adams (``experiment.optimizers``: group -> loss name -> Adam) at ``rates`` per loss name (its
    config has one lr for all); a name no group's optimizers have is an error."""
    for by_loss in optimizers.values():
        unknown = set(rates) - set(by_loss)
        if unknown:
            raise KeyError(f"BenchMARL has no optimizer for {sorted(unknown)} (it has {sorted(by_loss)})")
        for loss_name, optimizer in by_loss.items():
            for group in optimizer.param_groups:
                group["lr"] = rates.get(loss_name, group["lr"])


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """In the BenchMARL venv: the run ``spec`` describes, each evaluation recorded (return summed over agents).

    With ``spec["run_dir"]`` the run lives there and checkpoints at every evaluation (BenchMARL's own checkpoints,
    the curve beside them): a relaunch resumes from the newest readable checkpoint, with the curve and training
    seconds up to it (BenchMARL restores no optimizer or RNG state, so a resumed run is not the uninterrupted one)."""
    import importlib

    torch = importlib.import_module("torch")
    torch.set_num_threads(spec["threads"])
    for module in ("benchmarl.experiment", "benchmarl.algorithms", "benchmarl.models", "benchmarl.environments",
                   ENV_LIBRARY[spec["family"]]["benchmarl"]):
        importlib.import_module(module)  # before the clock, as on tdrl's side
    started = time.perf_counter()
    task, algorithm_cfg, (actor_cfg, critic_cfg), experiment_cfg = _configs(spec)
    run_dir = spec.get("run_dir")
    with contextlib.nullcontext(run_dir) if run_dir else tempfile.TemporaryDirectory() as folder:
        experiment_cfg.save_folder = folder
        curve: list[dict[str, float]] = []
        if run_dir:
            Path(folder).mkdir(parents=True, exist_ok=True)
            experiment_cfg.checkpoint_interval = experiment_cfg.evaluation_interval
            experiment_cfg.keep_checkpoints_num = 2  # BenchMARL deletes the oldest before writing the next
            checkpoint, curve = _restore_point(Path(folder), torch.load)
            experiment_cfg.restore_file = None if checkpoint is None else str(checkpoint)
        experiment = importlib.import_module("benchmarl.experiment").Experiment(
            task=task, algorithm_config=algorithm_cfg, model_config=actor_cfg, critic_model_config=critic_cfg,
            seed=spec["seed"], config=experiment_cfg)
        set_learning_rates(experiment.optimizers, spec["optimizer_lr"])
        earlier_wall = curve[-1]["wall_s"] if curve else 0.0
        curve = _record_evaluations(experiment, started, curve, Path(folder) / CURVE if run_dir else None)
        experiment.run()
    return {"curve": curve, "wall_s": earlier_wall + time.perf_counter() - started,
            "resumed": experiment_cfg.restore_file is not None}


ENV_LIBRARY = {"vmas": {"tdrl": "vmas", "benchmarl": "vmas"}, "mpe": {"tdrl": "mpe2", "benchmarl": "pettingzoo.mpe"},
               "lbf": {"tdrl": "lbforaging", "benchmarl": "lbforaging"}}
"""The env package each side's task imports (by task family): both workers import theirs before their clock."""
CURVE = "curve.json"  # in a BenchMARL run's folder: the evaluations so far, written after each


def _restore_point(folder: Path, load: Callable[..., Any]) -> tuple[Path | None, list[dict[str, float]]]:
    """The newest checkpoint under ``folder`` that ``load`` reads (unreadable newer ones are deleted: a kill while
    writing) and the curve up to its frames; ``(None, [])`` when there is none."""
    def frames(path: Path) -> int:
        return int(path.stem.removeprefix("checkpoint_"))

    curve = json.loads((folder / CURVE).read_text()) if (folder / CURVE).is_file() else []
    for checkpoint in sorted(folder.glob("*/checkpoints/checkpoint_*.pt"), key=frames, reverse=True):
        try:
            load(checkpoint, map_location="cpu")
        except Exception:  # a truncated file; the one before it stands
            checkpoint.unlink()
            continue
        return checkpoint, [p for p in curve if p["frames"] <= frames(checkpoint)]
    return None, []


def _record_evaluations(experiment: Any, started: float, earlier: list[dict[str, float]] | None = None,
                        store: Path | None = None) -> list[dict[str, float]]:
    """Hooks on ``experiment``: each evaluation appends ``{frames, train_s, wall_s, return_mean,
    benchmarl_return}`` to the returned list (after ``earlier``'s points, whose last seconds it counts on from),
    ``train_s`` without the evaluations' time; with ``store``, the list is written there after each."""
    curve: list[dict[str, float]] = list(earlier or [])
    before = {"train_s": curve[-1]["train_s"], "wall_s": curve[-1]["wall_s"]} if curve else {"train_s": 0.0,
                                                                                             "wall_s": 0.0}
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
        curve.append({"frames": int(total_frames),
                      "train_s": before["train_s"] + now - clock["run_start"] - clock["eval_s"],
                      "wall_s": before["wall_s"] + now - started, "return_mean": sum(summed) / len(summed),
                      "benchmarl_return": sum(per_agent) / len(per_agent)})
        if store is not None:
            _write_json(store, curve)

    experiment._evaluation_loop, experiment.logger.log_evaluation, experiment.run = (timed_evaluation, recorded,
                                                                                     timed_run)
    return curve


def _write_json(path: Path, value: Any) -> None:
    """``value`` as JSON at ``path``, whole or not at all (a kill mid-write leaves the previous file)."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value))
    os.replace(part, path)


# --- tdrl's side ---------------------------------------------------------------------------------------------------


def run_tdrl_recipe(task: str, algorithm: str, seed: int, frames: int, eval_interval: int, root: Path,
                    run_dir: Path | None = None) -> dict[str, Any]:
    """tdrl's recipe for ``algorithm`` on ``task`` in this process, through :func:`learning.run_tdrl`; with
    ``run_dir``, checkpointed there at every evaluation and resumed from there by a relaunch (bitwise)."""
    import learning

    algo = ALGORITHMS[algorithm]
    row_task = learning.Task(f"{task}-{algorithm}", algo.recipe, TASKS[task].env_id, threshold=math.inf,
                             budget=frames, overrides=[*algo.overrides, *TASKS[task].overrides],
                             eval_interval=eval_interval, eval_episodes=10)
    progress = run_dir / "progress.csv" if run_dir is not None else None
    earlier_wall = _last_cum_time(progress) if progress is not None else 0.0
    started = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # the recipe's own lines stay out of the report
        curve = learning.run_tdrl(row_task, seed, root, run_dir=run_dir)
    wall = earlier_wall + time.perf_counter() - started
    curve = [{**point, "wall_s": math.nan} for point in curve]  # the recipe's curve has no wall seconds
    curve[-1]["wall_s"] = wall
    return {"curve": curve, "wall_s": wall, "resumed": earlier_wall > 0}


def _last_cum_time(progress: Path) -> float:
    """A resumed run's seconds so far: its last progress row's ``CumTime`` (training and evaluation; tdrl
    checkpoints at each row), 0 for a new run."""
    if not progress.is_file():
        return 0.0
    with progress.open() as f:
        rows = list(csv.DictReader(f))
    return float(rows[-1]["CumTime"]) if rows else 0.0


def run_tdrl_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_tdrl_recipe` for a spec from :func:`tdrl_spec`, in the subprocess :func:`run_job` starts."""
    import importlib

    import learning

    sys.path.insert(0, str(ROOT))  # this checkout's tdrl and recipes
    learning.load_recipe(ALGORITHMS[spec["algorithm"]].recipe)  # its libraries imported before the clock, as
    importlib.import_module(ENV_LIBRARY[TASKS[spec["task"]].family]["tdrl"])  # BenchMARL's side does
    run_dir = Path(spec["run_dir"]) if spec["run_dir"] else None
    with tempfile.TemporaryDirectory() as tmp:
        return run_tdrl_recipe(spec["task"], spec["algorithm"], spec["seed"], spec["frames"], spec["eval_interval"],
                               Path(tmp), run_dir)


# --- Runs: one subprocess each, results kept ------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One run: ``side`` (tdrl or benchmarl) of ``algorithm`` on ``task`` at ``seed``, started as ``command``."""

    task: str
    algorithm: str
    side: str
    seed: int
    command: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.task}-{self.algorithm}"

    def folder(self, results: Path) -> Path:
        return run_folder(results, self.task, self.algorithm, self.side, self.seed)


def run_folder(results: Path, task: str, algorithm: str, side: str, seed: int) -> Path:
    """Where ``--results`` keeps one run: ``<results>/<task>-<algorithm>/<side>-seed<seed>``."""
    return results / f"{task}-{algorithm}" / f"{side}-seed{seed}"


def jobs(args: argparse.Namespace, python: Path | None, results: Path | None) -> list[Job]:
    """Every run, each seed's BenchMARL run (unless ``--no-benchmarl``) then its tdrl run (with ``--tdrl``): with
    ``--jobs 2`` the two sides of a seed run side by side."""
    out = []
    for task, algorithm in args.runs:
        settings = run_settings(task, algorithm, args.frames, args.eval_interval)
        interval = settings["experiment"]["evaluation_interval"]
        for seed in args.seeds:
            where = {side: str(run_folder(results, task, algorithm, side, seed) / "run") if results else ""
                     for side in SIDES}
            if python is not None:
                spec = {**worker_spec(task, algorithm, seed, settings), "run_dir": where["benchmarl"],
                        "family": TASKS[task].family}
                out.append(Job(task, algorithm, "benchmarl", seed, (str(python), __file__, "--worker",
                                                                    json.dumps(spec))))
            if args.tdrl:
                spec = {"task": task, "algorithm": algorithm, "seed": seed, "frames": args.frames,
                        "eval_interval": interval, "run_dir": where["tdrl"]}
                out.append(Job(task, algorithm, "tdrl", seed, (sys.executable, __file__, "--tdrl-worker",
                                                               json.dumps(spec))))
    return out


def run_job(job: Job, results: Path | None) -> dict[str, Any]:
    """``job``'s row: kept from ``results`` when it finished there before, else run in a subprocess (its output in
    the run's ``log.txt`` with ``results``) and kept there."""
    if results is not None and (job.folder(results) / "result.json").is_file():
        result = dict(json.loads((job.folder(results) / "result.json").read_text()))
        _plottable(job, results, result)
        return result
    with tempfile.TemporaryDirectory() as tmp:
        log = (job.folder(results) if results is not None else Path(tmp)) / "log.txt"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as stderr:
            proc = subprocess.run(job.command, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  cwd=tempfile.gettempdir())
        lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
        if proc.returncode or not lines:
            raise RuntimeError(f"{job.side} {job.name} seed {job.seed} failed (exit {proc.returncode}); the end of "
                               f"its log{f' ({log})' if results is not None else ''}:\n{log.read_text()[-3000:]}")
    result = row(job.name, job.side, job.seed, json.loads(lines[-1].removeprefix(RESULT)))
    if results is not None:
        _write_json(job.folder(results) / "result.json", result)
        _plottable(job, results, result)
    return result


def _plottable(job: Job, results: Path, result: dict[str, Any]) -> None:
    """Make the run one ``tdrl plot`` draws: ``variant.json`` (side and seed) above its run directory, and for
    BenchMARL's side a ``progress.csv`` of its evaluations (tdrl's run writes its own)."""
    folder = job.folder(results)
    if not (folder / "variant.json").is_file():
        _write_json(folder / "variant.json", {"impl": job.side, "seed": job.seed})
    progress = folder / "run" / "progress.csv"
    if job.side == "benchmarl" and not progress.is_file():
        with progress.open("w", newline="") as f:
            out = csv.writer(f, lineterminator="\n")
            out.writerow(["CumSteps", "eval/return_mean", "time/train_s"])
            out.writerows([p["frames"], repr(float(p["return_mean"])), repr(float(p["train_s"]))]
                          for p in result["curve"])


def plot_curves(results: Path, names: list[str], out_dir: Path) -> None:
    """Per task and algorithm, both sides' evaluation curves (IQM and 95% band over seeds, ``tdrl plot``'s) as
    ``<out_dir>/marl-<task>-<algorithm>.png``."""
    from tdrl.plot import plot_learning_curves

    out_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            for png in plot_learning_curves([results / name], metrics=["eval/return_mean"], out_dir=tmp):
                target = out_dir / f"marl-{name}.png"
                shutil.copyfile(png, target)
                print(f"curves: {os.path.relpath(target, ROOT) if target.is_relative_to(ROOT) else target}")


# --- Report --------------------------------------------------------------------------------------------------------


def row(name: str, impl: str, seed: int, result: dict[str, Any]) -> dict[str, Any]:
    """Run ``<task>-<algorithm>`` as ``learning.py`` reports one: final return (summed over agents), seconds."""
    last = result["curve"][-1]
    return {"task": name, "impl": impl, "seed": seed, "final_return": last["return_mean"],
            "final_frames": last["frames"], "train_s": last["train_s"], "wall_s": result["wall_s"],
            "resumed": bool(result.get("resumed", False)), "curve": result["curve"]}


def print_row(r: dict[str, Any]) -> None:
    per_agent = r["curve"][-1].get("benchmarl_return")
    logged = f" (BenchMARL logs {_returns(per_agent)[0]} per agent)" if per_agent is not None else ""
    frames_s = r["final_frames"] / r["train_s"] if r["train_s"] > 0 else math.nan
    resumed = " (resumed: seconds to its last checkpoint, then the last attempt's)" if r.get("resumed") else ""
    print(f"{r['task']:20s} {r['impl']:9s} seed {r['seed']}: final {_returns(r['final_return'])[0]:>8s}{logged} at "
          f"{r['final_frames']:,} frames; train {r['train_s']:.1f} s ({frames_s:,.0f} frames/s), "
          f"wall {r['wall_s']:.1f} s{resumed}", flush=True)


SIDES = ("tdrl", "benchmarl")


def summarise(rows: list[dict[str, Any]]) -> None:
    """Per task and algorithm, tdrl beside BenchMARL: seeds, the final return's IQM with its 95% bootstrap CI over
    seeds (``tdrl.plot.iqm_with_ci``), frames, and the mean training and wall seconds."""
    print(f"\n{'':20s} {'seeds':>7s}  {'final return, summed over agents: IQM [95% CI]':^56s}  {'frames':>9s}  "
          f"{'train s (mean)':^19s}  {'wall s (mean)':^19s}")
    print(f"{'task-algorithm':20s} {'t / b':>7s}  {'tdrl':^27s} {'BenchMARL':^28s}  {'':9s}  "
          f"{'tdrl':>9s} {'BenchMARL':>9s}  {'tdrl':>9s} {'BenchMARL':>9s}")
    for name in dict.fromkeys(r["task"] for r in rows):
        runs = {impl: [r for r in rows if r["task"] == name and r["impl"] == impl] for impl in SIDES}
        seeds = " / ".join(str(len(runs[impl])) for impl in SIDES)
        finals = [_center([r["final_return"] for r in runs[impl]]) for impl in SIDES]
        frames = max(r["final_frames"] for impl in SIDES for r in runs[impl])
        seconds = [_seconds(runs[impl], key) for key in ("train_s", "wall_s") for impl in SIDES]
        print(f"{name:20s} {seeds:>7s}  {finals[0]:>27s} {finals[1]:>28s}  {frames:9,d}  {seconds[0]} {seconds[1]}  "
              f"{seconds[2]} {seconds[3]}")
    print("(t / b: tdrl's and BenchMARL's seeds; one seed: its return, no CI; returns summed over the task's agents; "
          "train s excludes evaluation, wall s is the whole run)")


def _seconds(runs: list[dict[str, Any]], key: str) -> str:
    return f"{sum(r[key] for r in runs) / len(runs):9.1f}" if runs else f"{'-':>9s}"


def _returns(*values: float) -> list[str]:
    """Returns printed alike: one decimal, or two where all are under 10 (LBF's lie in [0, 1])."""
    digits = 2 if all(abs(v) < 10 for v in values) else 1
    return [f"{v:.{digits}f}" for v in values]


def _center(values: list[float]) -> str:
    """The IQM of ``values`` with its 95% bootstrap CI (tdrl's plots' own), or the one value, or '-'."""
    if len(values) < 2:
        return f"{_returns(values[0])[0]} (one seed)" if values else "-"
    import numpy as np

    from tdrl.plot import iqm_with_ci

    center, low, high = iqm_with_ci(np.asarray(values, dtype=float)[:, None])
    center_s, low_s, high_s = _returns(center[0], low[0], high[0])
    return f"{center_s} [{low_s}, {high_s}]"


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


# --- Main ----------------------------------------------------------------------------------------------------------


def make_parser() -> argparse.ArgumentParser:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    add = parser.add_argument
    add("--tasks", default=",".join(TASKS), help="comma-separated: " + ", ".join(
        f"{name} ({'/'.join(task.algorithms)})" for name, task in TASKS.items()))
    add("--algorithms", default=",".join(ALGORITHMS), help="comma-separated, of each task's: " + ", ".join(ALGORITHMS))
    add("--frames", type=int, default=12_000, help="env frames per run (each step of all agents); a multiple of "
        "every run's batch (MAPPO/IPPO 800, on VMAS 6,000; QMIX 100; MASAC 200)")
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
    add("--results", default="", metavar="DIR", help="keep each run in DIR (checkpointed: a rerun of the command "
        "resumes unfinished runs and reports finished ones without running them)")
    add("--plot", default="", metavar="DIR", help="with --results: write each task and algorithm's curves, both "
        "sides, to DIR/marl-<task>-<algorithm>.png (e.g. docs/data)")
    add("--kept-only", action="store_true", help="with --results: report the runs finished there, run nothing")
    add("--jobs", type=int, default=1, help="runs at a time (2: the two sides of a seed side by side)")
    add("--worker", default="", help=argparse.SUPPRESS)
    add("--tdrl-worker", default="", help=argparse.SUPPRESS)
    return parser


def _names(p: argparse.ArgumentParser, text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = sorted(set(names) - set(known))
    if unknown:
        p.error(f"unknown {what}(s) {unknown}; choose from {list(known)}")
    return names


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = make_parser()
    args = p.parse_args(argv)
    args.tasks = _names(p, args.tasks, list(TASKS), "task")
    args.algorithms = _names(p, args.algorithms, list(ALGORITHMS), "algorithm")
    args.runs = pairs(args.tasks, args.algorithms)
    if not args.runs and not (args.worker or args.tdrl_worker):
        p.error(f"no task of {args.tasks} is compared with {args.algorithms}: " + "; ".join(
            f"{name}: {'/'.join(TASKS[name].algorithms)}" for name in args.tasks))
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    if args.no_benchmarl and not args.tdrl:
        p.error("--no-benchmarl runs nothing without --tdrl")
    if (args.plot or args.kept_only) and not args.results:
        p.error("--plot and --kept-only read the runs kept in --results DIR")
    return args


def run_all(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run and seed (:func:`jobs`), ``--jobs`` at a time, each printed as it ends; in the jobs' order."""
    python = None if args.no_benchmarl else ensure_venv(Path(args.venv), args.torch, args.torch_index_url)
    if python is not None:
        print(f"BenchMARL's venv: {venv_versions(python)}")
    print_settings(args.runs, args.frames, args.eval_interval)
    results = Path(args.results).resolve() if args.results else None
    if results is not None:
        print(f"--results {results}: both sides checkpoint at every evaluation (BenchMARL's checkpoint_interval set "
              "to its evaluation_interval, the newest 2 kept) and resume from there")
    print()
    todo = jobs(args, python, results)
    if args.kept_only:  # a report of what has finished while the rest runs (or waits)
        assert results is not None
        todo = [job for job in todo if (job.folder(results) / "result.json").is_file()]
        print(f"{len(todo)} of {len(jobs(args, python, results))} runs finished in {results}; reporting those\n")
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_job, job, results) for job in todo]
        for future in as_completed(futures):
            print_row(future.result())
    return [future.result() for future in futures]


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.worker or args.tdrl_worker:
        run = worker if args.worker else run_tdrl_worker
        print(RESULT + json.dumps(run(json.loads(args.worker or args.tdrl_worker))), flush=True)
        return []
    sys.path.insert(0, str(ROOT))  # this checkout's tdrl and recipes
    if args.settings:
        print_settings(args.runs, args.frames, args.eval_interval)
        return []
    rows = run_all(args)
    summarise(rows)
    if args.csv:
        write_csv(rows, Path(args.csv))
    if args.plot:
        plot_curves(Path(args.results), list(dict.fromkeys(r["task"] for r in rows)), Path(args.plot))
    return rows


if __name__ == "__main__":
    if "--worker" in sys.argv or "--tdrl-worker" in sys.argv:
        main()
    else:
        from report import markdown_page

        with markdown_page("Multi-agent"):  # --markdown PAGE#SECTION, e.g. docs/multiagent.md#simple-spread
            main()
