"""The prepared GPU check: one command that proves tdrl on a lent GPU machine and measures it against its CPU.

A GPU machine is lent only now and then, for minutes, with no package index: everything it needs is prepared here.

* Here (any machine with pip and PyPI): ``make gpu-wheels`` fills the git-ignored ``.whl/`` with what the lent
  machine lacks, as cp312 manylinux x86_64 wheels (``pip download --no-deps``; the list is ``GPU_WHEELS`` in the
  Makefile). It has Python 3.12, torch 2.11.0+cu130, numpy, opencv, pytest and tqdm; it lacks tensordict, torchrl,
  gymnasium and ale-py (12 MiB of wheels with a trimmed envpool's; a call carries 64 MiB with the repository). MuJoCo
  and W&B stay behind: the check uses Pendulum and ``logger.wandb=false``. Checked on this CPU machine in a Python
  3.12 venv with PyPI's torch 2.11.0+cu130: tensordict 0.14.3's compiled part loads (it links no torch symbol);
  torchrl 0.14.1's C++ extension does not (an undefined torch symbol; 0.13.3's loads), and tdrl uses none of it (its
  sum tree and the losses are Python), so the check keeps the versions the CPU suite verified.
* There, in one call (the device tool's ``run`` with ``carry=[".whl"]``): ``make gpu-check`` installs the wheels into
  ``/tmp/tdrl-site`` and runs this script, which rewrites its section of ``docs/gpu.md`` in place (with ``$OUT`` set,
  a copy there, written as the check runs, so a call cut off at its time limit still returns the steps that ran).
  It is sized to end in about 6 minutes, leaving time to run it again. Without ``.whl/`` it downloads the wheels
  first, so on a GPU machine where pip reaches an index it is the one command; where pip cannot, it ends with one
  line saying to carry ``.whl/`` from a machine that can.
* On CPU: ``python benchmarks/gpu_check.py --dry-run`` runs every step at tiny budgets on the CPU (CI runs it, so
  the script is tested before a GPU sees it).

Steps, each in its own processes with a time limit, so one failure is reported and the rest still run:

1. versions: Python, torch, CUDA device, tensordict, torchrl (and whether its C++ extension loaded), gymnasium, ale-py,
   envpool;
2. the CUDA-marked tests (``pytest -m gpu`` over the test files that have them), with the failures' tracebacks;
3. every recipe with ``run.device=cuda`` at a tiny budget;
4. update rows (``benchmarks/gpu_updates.py``): DQN (Nature CNN on Pong, batch 32), SAC (256x256 on Pendulum, batch
   256) and R2D1, each the real recipe run for a fixed time: the learner alone (many updates per env frame), the whole
   loop with checkpoints off, and with a checkpoint per log row; CUDA graphs on and off; the CPU's loop rows after
   the GPU's, never beside them; and where the loop's time goes, by phase;
5. Atari agent steps per second with the Nature CNN on the GPU: the action server and the alternating server (one
   worker process per core) against gymnasium's AsyncVectorEnv and envpool, sync and async, on the same cores
   (``make gpu-wheels`` carries a trimmed, Atari-only envpool: ``benchmarks/envpool_wheel.py``).

Usage::

    python benchmarks/gpu_check.py [--dry-run] [--markdown docs/gpu.md] [--skip tests recipes ...]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_updates import ROOT, recipe_env, update_rows

RECIPES = ("ppo", "a2c", "impala", "dqn", "ddpg", "td3", "sac", "r2d1")
STEPS = ("versions", "tests", "recipes", "updates", "atari")
MAX_FAILURE_LINES = 300  # of the failing tests' short tracebacks (then the summary of every failure)
COMMON = ("logger.wandb=false", "logger.progress_bar=false")
OFF_POLICY_TINY = ("optim.min_steps_learn=16", "optim.batch_size=16", "optim.replay_ratio=16", "replay.size=1000",
                   "model.hidden_sizes=[16]")
TINY = {  # a few iterations and two log rows per recipe (as tests/test_readme.py runs the README's commands)
    "ppo": ("collector.total_frames=256", "logger.log_interval_steps=128", "loss.epochs=1"),
    "a2c": ("collector.total_frames=80", "logger.log_interval_steps=40"),
    "impala": ("collector.total_frames=160", "logger.log_interval_steps=80"),
    "dqn": ("collector.total_frames=64", "logger.log_interval_steps=32", *OFF_POLICY_TINY),
    "ddpg": ("collector.total_frames=40", "logger.log_interval_steps=20", *OFF_POLICY_TINY),
    "td3": ("collector.total_frames=40", "logger.log_interval_steps=20", *OFF_POLICY_TINY),
    "sac": ("collector.total_frames=40", "logger.log_interval_steps=20", *OFF_POLICY_TINY),
    "r2d1": ("collector.batch_B=2", "collector.batch_T=10", "collector.total_frames=400",
             "logger.log_interval_steps=200", "optim.min_steps_learn=200", "model.hidden_sizes=[16]",
             "model.lstm_size=16", "model.head_sizes=[16]", "replay.size=2000", "replay.warmup_T=5",
             "replay.batch_T=10", "loss.n_step=3", "optim.batch_B=4", "optim.replay_ratio=6"),
}


class Check:
    """Collects each step's outcome: a line in the page, and the exit status at the end."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def step(self, name: str, body: Callable[[], None]) -> None:
        print(f"\n## {name}\n", flush=True)
        started = time.perf_counter()
        try:
            body()
        except Exception as e:  # noqa: BLE001 - a failed step is reported, the next one still runs
            self.failed.append(name)
            print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        print(f"({name}: {time.perf_counter() - started:.0f} s)", flush=True)


def versions(device: str) -> None:
    import torch

    print(f"- Python {sys.version.split()[0]}, torch {torch.__version__}, device {device}"
          + (f" ({torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda})" if device == "cuda" else ""))
    for name in ("numpy", "tensordict", "torchrl", "gymnasium", "ale_py", "envpool", "cv2"):
        try:
            module = importlib.import_module(name)
            print(f"- {name} {getattr(module, '__version__', '?')}")
        except Exception as e:  # noqa: BLE001 - a missing package is a line of the page, not a failure here
            print(f"- {name}: not importable ({type(e).__name__}: {e})")
    extension = importlib.util.find_spec("torchrl._torchrl") is not None
    if extension:
        try:
            importlib.import_module("torchrl._torchrl")
        except Exception as e:  # noqa: BLE001 - built against another torch: torchrl runs without it
            extension = False
            print(f"- torchrl's C++ extension does not load ({e}); tdrl does not use it")
    print(f"- torchrl's C++ extension loaded: {extension}")


def cuda_tests(timeout_s: float) -> None:
    files = sorted({str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                    if "pytest.mark.gpu" in p.read_text()})
    print(f"test files with CUDA tests: {', '.join(files)}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           "--tb=short", "--show-capture=no", "-p", "no:logging", "-rfE", *files],
                          cwd=ROOT, env=recipe_env(), capture_output=True, text=True, timeout=timeout_s)
    lines = proc.stdout.splitlines()

    def section(title: str) -> int | None:
        return next((i for i, line in enumerate(lines) if line.startswith("=") and f" {title} " in line), None)

    failures, summary = section("FAILURES"), section("short test summary info")
    if failures is not None:  # a traceback is all a session gets to fix it with before the next lent machine
        print("\n".join(lines[failures:summary][:MAX_FAILURE_LINES]))
    print("\n".join(lines[summary:] if summary is not None else lines[-15:]))
    if proc.returncode not in (0, 5):  # 5: nothing selected (no gpu test collected)
        raise RuntimeError(f"pytest exit {proc.returncode}: {proc.stderr[-2000:]}")


def _recipe(recipe: str, args: tuple[str, ...], run_dir: Path) -> list[str]:
    return [sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), *COMMON, *args, f"run.dir={run_dir}"]


def recipes_on_device(device: str, workdir: Path, timeout_s: float) -> None:
    """Every recipe at its tiny budget, several at a time (two on a 2-core machine)."""
    failures = []
    launches = {r: _recipe(r, (*TINY[r], f"run.device={device}", "eval.n_envs=1", "eval.max_steps=20"),
                           workdir / f"tiny_{r}") for r in RECIPES}
    pending = list(launches)
    running: dict[str, tuple[subprocess.Popen[str], float]] = {}
    deadline = time.monotonic() + timeout_s
    while pending or running:
        while pending and len(running) < max(2, len(os.sched_getaffinity(0)) // 4):
            name = pending.pop(0)
            running[name] = (subprocess.Popen(launches[name], env=recipe_env(), stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True), time.perf_counter())
        name = next(iter(running))
        proc, started = running.pop(name)
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        ok = proc.returncode == 0
        print(f"| {name} | {'ok' if ok else f'exit {proc.returncode}'} | {time.perf_counter() - started:.1f} s |")
        if not ok:
            failures.append(name)
            print("```text\n" + "\n".join(out.splitlines()[-12:]) + "\n```")
    if failures:
        raise RuntimeError(f"recipes failed on {device}: {', '.join(failures)}")


def _collected(collector: Any, frames: int) -> int:
    """One batch of ``collector``: its ``frames``."""
    collector.collect()
    return frames


def _rate(step: Callable[[], int], seconds: float) -> float:
    """Agent steps per second of ``step`` (it returns the steps it took) over ``seconds``, after one warm-up call."""
    step()  # start-up, first forward
    frames, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        frames += step()
    return frames / (time.perf_counter() - started)


def _vector_loop(vec: Any, obs: Any, act: Callable[[Any], Any], envs: int, steps: int) -> Callable[[], int]:
    """``steps`` lock-steps of a vector env (gymnasium's, or envpool in sync mode) from its first ``obs``, with
    ``act`` choosing the actions."""
    state = {"obs": obs}

    def step() -> int:
        for _ in range(steps):
            state["obs"], *_ = vec.step(act(state["obs"]))
        return envs * steps
    return step


def _async_loop(pool: Any, act: Callable[[Any], Any], batch: int, steps: int) -> Callable[[], int]:
    """``steps`` rounds of envpool's async mode: act on the ``batch`` envs that are ready, send their actions."""
    pool.async_reset()

    def step() -> int:
        for _ in range(steps):
            obs, *_, info = pool.recv()
            pool.send(act(obs), info["env_id"])
        return batch * steps
    return step


def _baseline_rows(act: Callable[[Any], Any], workers: int, steps: int, seconds: float) -> list[tuple[str, float]]:
    """gymnasium's AsyncVectorEnv (a process per env) and, where importable, envpool sync and async."""
    import gymnasium as gym

    from tdrl.envs import make_env

    vec = gym.vector.AsyncVectorEnv([functools.partial(make_env, "ALE/Pong-v5") for _ in range(workers)])
    try:
        rows = [(f"gymnasium AsyncVectorEnv ({workers} processes, {workers} envs)",
                 _rate(_vector_loop(vec, vec.reset(seed=0)[0], act, workers, steps), seconds))]
    finally:
        vec.close()
    try:
        envpool = importlib.import_module("envpool")  # untyped
    except Exception as e:  # noqa: BLE001 - an optional baseline: its absence is a line of the page
        print(f"envpool rows skipped: {type(e).__name__}: {e} (make gpu-wheels carries a trimmed envpool)")
        return rows
    envs = 2 * workers
    for batch in (envs, envs // 2):  # sync, then async
        pool = envpool.make_gymnasium("Pong-v5", num_envs=envs, batch_size=batch, num_threads=workers, seed=0,
                                      repeat_action_probability=0.25, use_fire_reset=False)
        try:
            loop = (_vector_loop(pool, pool.reset()[0], act, envs, steps) if batch == envs
                    else _async_loop(pool, act, batch, steps))
            mode = "sync" if batch == envs else f"async, batch {batch}"
            rows.append((f"envpool {mode} ({workers} threads, {envs} envs)", _rate(loop, seconds)))
        finally:
            pool.close()
    return rows


def atari_frames(device: str, dry_run: bool, seconds: float, cores: int) -> None:
    """Atari Pong agent steps per second with the Nature CNN on ``device``: tdrl's action server and alternating
    server (envs in CPU worker processes) against gymnasium's AsyncVectorEnv (one process per env) and envpool's
    C++ threads, sync and async (``batch_size`` half the envs: the CNN acts on the half that is ready), where
    importable (``make gpu-wheels`` carries a trimmed, Atari-only envpool)."""
    import numpy as np
    import torch

    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory
    from tdrl.models import make_q_actor

    workers = 2 if dry_run else cores  # one worker process (or envpool thread) per core
    steps = 8 if dry_run else 32
    factory = EnvFactory("ALE/Pong-v5")
    torch.manual_seed(0)
    actor = make_q_actor(factory.specs()).to(device)
    net = actor.module[0].module  # the plain network: observation -> Q-values

    def act(obs: Any) -> np.ndarray:
        with torch.no_grad():
            return net(torch.from_numpy(np.asarray(obs)).to(device, non_blocking=True)).argmax(-1).cpu().numpy()

    rows = []
    servers = [("action_server", workers, workers), ("action_server", workers, 2 * workers),
               ("alternating", workers // 2, 2 * workers)]  # (kind, worker processes per group, envs)
    for kind, n_workers, envs in servers:
        collector = make_collector(kind, factory, actor, batch_B=envs, batch_T=steps, n_workers=n_workers, seed=0,
                                   return_same_td=True)
        procs = n_workers * (2 if kind == "alternating" else 1)
        try:
            rows.append((f"tdrl {kind.replace('_', ' ')} ({procs} worker processes, {envs} envs)",
                         _rate(functools.partial(_collected, collector, envs * steps), seconds)))
        finally:
            collector.shutdown()
    rows += _baseline_rows(act, workers, steps, seconds)
    print(f"\nPong-v5, {steps} steps per batch, the Nature CNN on {device}, {cores} cores\n")
    print("| collector | agent steps/s | vs the first row |\n|---|---:|---:|")
    for name, fps in rows:
        print(f"| {name} | {fps:,.0f} | {fps / rows[0][1]:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    from report import add_markdown_option, markdown_page

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--dry-run", action="store_true", help="every step at tiny budgets, on the CPU (CI)")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="steps to leave out")
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per throughput row")
    parser.add_argument("--update-rows", nargs="+", default=["learner", "loop", "checkpoint"],
                        choices=["learner", "loop", "checkpoint"], help="which update rows to run")
    with markdown_page("GPU check"):  # --markdown PAGE#SECTION: into its docs section
        args = parser.parse_args(argv)
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu" and not args.dry_run:
            print("error: no CUDA device here; use --dry-run to run the steps on the CPU", file=sys.stderr)
            return 2
        seconds = args.seconds or (1.0 if args.dry_run else 8.0)
        cores = len(os.sched_getaffinity(0))
        check = Check()
        workdir = Path(tempfile.mkdtemp(prefix="tdrl-gpu-check-"))
        steps = {
            "versions": lambda: versions(device),
            "tests": lambda: cuda_tests(timeout_s=150),
            "recipes": lambda: recipes_on_device(device, workdir, timeout_s=150),
            "updates": lambda: update_rows(device, args.dry_run, workdir, seconds, max(1, cores // 4),
                                           tuple(args.update_rows)),
            "atari": lambda: atari_frames(device, args.dry_run, seconds / 2, cores),
        }
        print(f"Mode: {'dry run on the CPU (tiny budgets)' if args.dry_run else 'GPU check'}; device {device}; "
              f"{cores} cores; {seconds:.0f} s per throughput row.")
        for name, body in steps.items():
            if name not in args.skip:
                check.step(name, body)
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"\nSteps failed: {', '.join(check.failed) or 'none'}")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
