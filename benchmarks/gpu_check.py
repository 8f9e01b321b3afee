"""The prepared GPU check: one command that proves tdrl on a lent GPU machine and measures it against its CPU.

A GPU machine is lent only now and then, for minutes, with no package index: everything it needs is prepared here.

* Here (any machine with pip and PyPI): ``make gpu-wheels`` fills the git-ignored ``.whl/`` with what the lent
  machine lacks, as cp312 manylinux x86_64 wheels (``pip download --no-deps``; the list is ``GPU_WHEELS`` in the
  Makefile). It has Python 3.12, torch 2.11.0+cu130, numpy, opencv, pytest and tqdm; it lacks tensordict, torchrl,
  gymnasium and ale-py (7.5 MiB of wheels; a call carries 64 MiB with the repository). MuJoCo and W&B stay behind:
  the check uses Pendulum and ``logger.wandb=false``. Checked on this CPU machine in a Python 3.12 venv with PyPI's
  torch 2.11.0+cu130: tensordict 0.14.3's compiled part loads (it links no torch symbol); torchrl 0.14.1's C++
  extension does not (an undefined torch symbol; 0.13.3's loads), and tdrl uses none of it (its sum tree and the
  losses are Python), so the check keeps the versions the CPU suite verified.
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
4. updates per second, GPU against this machine's CPU in the same run: DQN (Nature CNN on Pong, batch 32), SAC
   (256x256 on Pendulum, batch 256) and R2D1, each with ``optim.compile`` and ``optim.cudagraphs`` off and on (a
   failed row's output follows the table). Each
   variant is the real recipe, run for a fixed time and stopped (SIGTERM); the figure is the median
   ``UpdatesPerSecond`` of its progress rows after the first row with updates (compilation and warm-up);
5. Atari frames per second of the action server (the Nature CNN on the GPU, 8 and 16 CPU worker processes) against
   gymnasium's AsyncVectorEnv with the same CNN on the GPU, same envs, same cores; envpool too where it is
   importable (it is not carried: with its assets it is 115 MB, over the 64 MiB a call carries).

Usage::

    python benchmarks/gpu_check.py [--dry-run] [--markdown docs/gpu.md] [--skip tests recipes ...]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ("ppo", "a2c", "impala", "dqn", "ddpg", "td3", "sac", "r2d1")
STEPS = ("versions", "tests", "recipes", "updates", "atari")
MAX_FAILURE_LINES = 300  # of the failing tests' short tracebacks (then the summary of every failure)
FAILED_ROW_LINES = 30  # of a failed update row's recipe output
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
# Update-bound settings: many updates per collected frame, so the rows measure the update loop.
UPDATE_BENCH = {
    "dqn (Nature CNN, Pong, batch 32)": ("dqn", (
        "env.id=ALE/Pong-v5", "optim.batch_size=32", "optim.replay_ratio=64", "optim.min_steps_learn=256",
        "replay.size=20000", "exploration.eps_steps=1000", "loss.n_step=1", "eval.n_envs=0")),
    "sac (256x256, Pendulum, batch 256)": ("sac", (
        "env.id=Pendulum-v1", "model.hidden_sizes=[256,256]", "optim.batch_size=256", "optim.replay_ratio=256",
        "optim.min_steps_learn=256", "replay.size=20000", "eval.n_envs=0")),
    "r2d1 (LSTM, CartPole without velocities)": ("r2d1", ("eval.n_envs=0", "optim.min_steps_learn=1000")),
}
UPDATE_DRY = {  # the same rows at sizes a CPU finishes in seconds
    "dqn": ("optim.batch_size=4", "optim.replay_ratio=4", "optim.min_steps_learn=16", "replay.size=2000"),
    "sac": ("model.hidden_sizes=[16]", "optim.batch_size=16", "optim.replay_ratio=16", "optim.min_steps_learn=32"),
    "r2d1": tuple(a for a in TINY["r2d1"] if not a.startswith(("collector.total_frames", "logger."))),
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


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


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
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout_s)
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
            running[name] = (subprocess.Popen(launches[name], env=_env(), stdout=subprocess.PIPE,
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


def _progress_rates(path: Path) -> list[float]:
    """``UpdatesPerSecond`` of the progress rows after the first row with updates (it holds compilation and
    warm-up); empty while there are none."""
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    if len(lines) < 2:
        return []
    column = lines[0].split(",").index("UpdatesPerSecond")
    rates = [float(line.split(",")[column] or "nan") for line in lines[1:] if line.count(",") >= column]
    first = next((i for i, r in enumerate(rates) if r > 0), len(rates))
    return [r for r in rates[first + 1:] if r > 0]


def updates_per_second(recipe: str, args: tuple[str, ...], run_dir: Path, seconds: float) -> tuple[float, str]:
    """Run the recipe until ``seconds`` after its first timed progress row (see :func:`_progress_rates`), stop it
    (SIGTERM), and return the median update rate of its timed rows, or NaN and the reason."""
    proc = subprocess.Popen(_recipe(recipe, ("collector.total_frames=100000000", *args), run_dir), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    progress = run_dir / "progress.csv"
    started, deadline = time.monotonic(), time.monotonic() + 4 * seconds + 120  # room for start-up and compilation
    timed_from = None  # the first row after the warm-up row: timing starts there
    while proc.poll() is None and time.monotonic() < deadline:
        if timed_from is None and _progress_rates(progress):
            timed_from = time.monotonic()
        if timed_from is not None and time.monotonic() - timed_from >= seconds:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    rates = _progress_rates(progress)
    if not rates:
        return float("nan"), (f"no update rate after {time.monotonic() - started:.0f} s (exit {proc.returncode})\n"
                              + "\n".join(out.strip().splitlines()[-FAILED_ROW_LINES:]))
    return statistics.median(rates), f"{len(rates)} rows"


def update_table(device: str, dry_run: bool, workdir: Path, seconds: float, cpu_threads: int) -> None:
    """The update rates: on the GPU one variant at a time (plain, compiled, CUDA graphs, both); on the CPU the
    plain variant of each recipe, run beside them with ``cpu_threads`` torch threads each (a dry run: CPU only)."""
    gpu_variants = ((False, False), (True, False), (False, True), (True, True))
    jobs = []  # (label, device, compile, cudagraphs, recipe, args, run dir)
    for label, (recipe, args) in UPDATE_BENCH.items():
        if dry_run:
            args = (*[a for a in args if a.startswith(("env.id=", "eval."))], *UPDATE_DRY[recipe])
        interval = 8 if dry_run else (64 if recipe != "r2d1" else 400)
        base = (*args, f"logger.log_interval_steps={interval}")
        variants = gpu_variants if recipe != "r2d1" else gpu_variants[:1]  # no optim.cudagraphs; compiled: for time
        for dev, compile_, graphs in [("cpu", False, False)] + (
                [("cuda", c, g) for c, g in variants] if device == "cuda" else []):
            settings = (*base, f"run.device={dev}", f"optim.compile={str(compile_).lower()}",
                        *(["optim.cudagraphs=true"] if graphs else []),
                        *([f"run.torch_threads={cpu_threads}"] if dev == "cpu" else []))
            run_dir = workdir / f"upd_{recipe}_{dev}_{int(compile_)}{int(graphs)}"
            jobs.append((label, dev, compile_, graphs, recipe, settings, run_dir))
    results: dict[int, tuple[float, str]] = {}
    cpu_jobs = [i for i, job in enumerate(jobs) if job[1] == "cpu"]
    with ThreadPoolExecutor(max_workers=len(cpu_jobs) if device == "cuda" else 1) as pool:  # subprocesses
        futures = {i: pool.submit(updates_per_second, jobs[i][4], jobs[i][5], jobs[i][6], seconds) for i in cpu_jobs}
        for i, job in enumerate(jobs):
            if job[1] == "cuda":
                results[i] = updates_per_second(job[4], job[5], job[6], seconds)
        results.update({i: future.result() for i, future in futures.items()})
    print("| update | device | compile | CUDA graphs | updates/s | vs cpu | note |")
    print("|---|---|---|---|---:|---:|---|")
    cpu_rate = {job[0]: results[i][0] for i, job in enumerate(jobs) if job[1] == "cpu"}
    failed_outputs = []
    for i, (label, dev, compile_, graphs, *_) in enumerate(jobs):
        rate, note = results[i]
        cpu = cpu_rate[label]
        ratio = f"{rate / cpu:.2f}x" if dev == "cuda" and cpu > 0 else ""
        summary, _, output = note.partition("\n")
        print(f"| {label} | {dev} | {compile_} | {graphs} | {rate:,.1f} | {ratio} | {summary} |")
        if output:
            failed_outputs.append(f"{label} on {dev}, compile {compile_}, CUDA graphs {graphs}:\n{output}")
    for output in failed_outputs:  # after the table, which they would break
        print(f"\n{output}")
    print(f"\nCPU rows: {cpu_threads} torch threads each" + (", run beside the GPU rows." if device == "cuda" else "."))
    if missing := [jobs[i][0] + " on " + jobs[i][1] for i, (rate, _) in results.items() if not rate > 0]:
        raise RuntimeError(f"no update rate for {', '.join(missing)}")


def _collected(collector: Any, frames: int) -> int:
    """One batch of ``collector``: its ``frames``."""
    collector.collect()
    return frames


def atari_frames(device: str, dry_run: bool, seconds: float) -> None:
    """The action server (the CNN on ``device``, envs in CPU worker processes) against gymnasium's AsyncVectorEnv
    (one process per env) and, where importable, envpool (threads), each with the same CNN on ``device``."""
    import gymnasium as gym
    import numpy as np
    import torch

    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory, make_env
    from tdrl.models import make_q_actor

    workers, envs, steps = (2, 4, 8) if dry_run else (8, 16, 32)
    factory = EnvFactory("ALE/Pong-v5")
    torch.manual_seed(0)
    actor = make_q_actor(factory.specs()).to(device)
    net = actor.module[0].module  # the plain network: observation -> Q-values

    def rate(step: Callable[[], int]) -> float:
        step()  # warm-up (start-up, first forward)
        frames, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            frames += step()
        return frames / (time.perf_counter() - started)

    def vector_loop(vec: Any, obs: np.ndarray) -> Callable[[], int]:
        state = {"obs": obs}

        def step() -> int:
            with torch.no_grad():
                for _ in range(steps):
                    q = net(torch.from_numpy(np.asarray(state["obs"])).to(device, non_blocking=True))
                    state["obs"], *_ = vec.step(q.argmax(-1).cpu().numpy())
            return envs * steps

        return step

    rows = []
    for n_workers in (workers, envs):  # two envs per worker, then one per worker as AsyncVectorEnv has
        collector = make_collector("action_server", factory, actor, batch_B=envs, batch_T=steps, n_workers=n_workers,
                                   seed=0, return_same_td=True)
        try:
            rows.append((f"tdrl action server ({n_workers} worker processes)",
                         rate(functools.partial(_collected, collector, envs * steps))))
        finally:
            collector.shutdown()
    vec = gym.vector.AsyncVectorEnv([functools.partial(make_env, "ALE/Pong-v5") for _ in range(envs)])
    try:
        rows.append((f"gymnasium AsyncVectorEnv ({envs} processes)", rate(vector_loop(vec, vec.reset(seed=0)[0]))))
    finally:
        vec.close()
    try:
        envpool = importlib.import_module("envpool")  # untyped
    except Exception as e:  # noqa: BLE001 - 115 MB with its assets: more than a GPU call may carry
        print(f"envpool row skipped: {type(e).__name__}: {e} (envpool and its assets are 115 MB, over the 64 MiB a "
              "lent GPU machine's call carries; docs/atari.md compares it on the CPU)")
    else:
        pool = envpool.make_gymnasium("Pong-v5", num_envs=envs, batch_size=envs, num_threads=workers, seed=0,
                                      repeat_action_probability=0.25, use_fire_reset=False)
        try:
            rows.append((f"envpool ({workers} threads)", rate(vector_loop(pool, pool.reset()[0]))))
        finally:
            pool.close()
    print(f"\nPong-v5, {envs} envs, {steps} steps per batch, the Nature CNN on {device}\n")
    print("| collector | frames/s | vs action server |\n|---|---:|---:|")
    for name, fps in rows:
        print(f"| {name} | {fps:,.0f} | {fps / rows[0][1]:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    from report import add_markdown_option, markdown_page

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--dry-run", action="store_true", help="every step at tiny budgets, on the CPU (CI)")
    parser.add_argument("--skip", nargs="*", default=[], choices=STEPS, help="steps to leave out")
    parser.add_argument("--seconds", type=float, default=None, help="timed seconds per throughput row")
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
            "updates": lambda: update_table(device, args.dry_run, workdir, seconds, max(1, cores // 4)),
            "atari": lambda: atari_frames(device, args.dry_run, seconds / 2),
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
