"""The GPU check's update rows: what an update costs alone, what the whole loop costs, and where the loop's time goes.

Every row is the real recipe, run for a fixed time after its first row with updates (compilation, graph capture and
warm-up) and stopped with SIGTERM; its figures come from the run's ``progress.csv``. Checkpoints are off
(``checkpoint.snapshot_mode=none``) except in the checkpoint rows, and the rows run one at a time, the CPU rows after
the GPU rows, so no row shares the machine with another.

* **learner**: one env frame per iteration and :data:`LEARNER_UPDATES` updates per iteration (the replay ratio), a log
  row per iteration: replay sample, update (and target update) back to back, one read-back to the host (the row's
  metrics) per :data:`LEARNER_UPDATES` updates; the env step and the row are spread over them.
* **loop**: the recipe's loop at update-bound settings (DQN two updates per frame, SAC one): collect, replay extend,
  sample, update, log rows.
* **checkpoint**: the loop with a checkpoint after every log row: what one checkpoint costs.

On the GPU the learner runs with CUDA graphs, and once more compiled (``optim.compile=true`` inside the graph); a
frame-stacked replay (DQN on Pong) runs its learner and loop once more with ``replay.device=cuda`` (its frames copied
to the GPU and the stacks gathered there, :class:`tdrl.replay.frames.FrameCopy`); ``auto`` keeps them on the host.

The phase split divides the ``time/<phase>_s`` columns (collect, extend, learn, log, checkpoint: cumulative wall
seconds of training, see ``tdrl.train.bookkeeping``) between the first timed row and the last by the updates between
them. On a GPU the host runs ahead of the device until it reads a result back, so a phase that reads back (collect:
the action; log: the metrics) also holds the wait for the device work queued before it.
"""

from __future__ import annotations

import csv
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ("logger.wandb=false", "logger.progress_bar=false", "eval.n_envs=0")
LEARNER_UPDATES = 250
"""Updates per iteration of a learner row (and per host read-back)."""
PHASES = ("collect", "extend", "learn", "log", "checkpoint")
FAILED_ROW_LINES = 30  # of a failed row's recipe output
NO_CHECKPOINTS = "checkpoint.snapshot_mode=none"
DRY_LOOP = ("logger.log_interval_steps=16",)  # a dry run's loop rows: the dry settings' own cadence


@dataclass(frozen=True)
class Workload:
    """One recipe at fixed settings: ``args`` for every row, ``loop`` for the loop rows, ``batch_size`` for the
    learner rows' replay ratio; ``dry`` replaces ``args`` in a CPU dry run."""

    label: str
    recipe: str
    args: tuple[str, ...]
    loop: tuple[str, ...]
    batch_size: int
    dry: tuple[str, ...]
    graphs: bool = True  # the recipe has optim.cudagraphs
    frames: bool = False  # a frame stack: replay.device=cuda rows (auto keeps its frames on the host)

    def learner(self) -> tuple[str, ...]:
        return ("collector.batch_B=1", "collector.batch_T=1", "logger.log_interval_steps=1",
                f"optim.replay_ratio={self.batch_size * LEARNER_UPDATES}")


WORKLOADS = (
    Workload("DQN, Nature CNN on Pong, batch 32", "dqn",
             ("env.id=ALE/Pong-v5", "optim.batch_size=32", "optim.min_steps_learn=256", "replay.size=20000",
              "exploration.eps_steps=1000", "loss.n_step=1"),
             ("optim.replay_ratio=64", "logger.log_interval_steps=128"), 32,
             ("env.id=ALE/Pong-v5", "optim.batch_size=4", "optim.min_steps_learn=16", "replay.size=2000",
              "model.hidden_sizes=[16]"), frames=True),
    Workload("SAC, 256x256 on Pendulum, batch 256", "sac",
             ("env.id=Pendulum-v1", "model.hidden_sizes=[256,256]", "optim.batch_size=256",
              "optim.min_steps_learn=256", "replay.size=20000"),
             ("optim.replay_ratio=256", "logger.log_interval_steps=256"), 256,
             ("model.hidden_sizes=[16]", "optim.batch_size=16", "optim.min_steps_learn=32")),
    Workload("R2D1, LSTM on CartPole without velocities", "r2d1", ("optim.min_steps_learn=1000",),
             ("logger.log_interval_steps=400",), 0,
             ("collector.batch_B=2", "collector.batch_T=10", "optim.min_steps_learn=200", "model.hidden_sizes=[16]",
              "model.lstm_size=16", "model.head_sizes=[16]", "replay.size=2000", "replay.warmup_T=5",
              "replay.batch_T=10", "loss.n_step=3", "optim.batch_B=4", "optim.replay_ratio=6"), graphs=False),
)


@dataclass
class Row:
    workload: Workload
    kind: str  # learner, loop, checkpoint
    device: str
    graphs: bool
    compiled: bool = False  # optim.compile=true: torch.compile fuses the loss's small ops (inside the graph)
    frames_on_gpu: bool = False  # replay.device=cuda: the frame stacks are gathered on the GPU
    rate: float = float("nan")  # median updates/s of the timed rows
    phases: dict[str, float] | None = None  # microseconds per update, by phase (and "other")
    checkpoint_ms: float = float("nan")
    note: str = ""

    @property
    def name(self) -> str:
        return self.kind + (", compiled" if self.compiled else "") + (", frames on GPU" if self.frames_on_gpu else "")


def recipe_env() -> dict[str, str]:
    """The environment of the check's subprocesses: this repository importable, W&B off, output unbuffered."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}


def _rows(path: Path) -> list[dict[str, float]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return [{k: float(v) if v else float("nan") for k, v in row.items()} for row in csv.DictReader(f)]


def _timed(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The rows after the first one with updates (it holds compilation, graph capture and warm-up)."""
    first = next((i for i, r in enumerate(rows) if r.get("UpdatesPerSecond", 0) > 0), len(rows))
    return [r for r in rows[first:] if r.get("UpdatesPerSecond", 0) > 0]


def _phases(timed: list[dict[str, float]]) -> tuple[dict[str, float], float]:
    """Microseconds per update by phase from the first timed row to the last; and ms per checkpoint."""
    first, last = timed[0], timed[-1]
    updates = last["CumUpdates"] - first["CumUpdates"]

    def spent(column: str) -> float:
        d = last.get(column, float("nan")) - first.get(column, float("nan"))
        return 0.0 if d != d else d  # a phase that never ran has no column

    per_update = {p: 1e6 * spent(f"time/{p}_s") / updates for p in PHASES}
    per_update["other"] = 1e6 * spent("time/train_s") / updates - sum(per_update.values())
    return per_update, 1e3 * spent("time/checkpoint_s") / max(len(timed) - 1, 1)


def run_row(row: Row, run_dir: Path, seconds: float, dry_run: bool, cpu_threads: int) -> None:
    """Run ``row``'s recipe until ``seconds`` after its first timed row, stop it, and fill in its figures."""
    w = row.workload
    loop = DRY_LOOP if dry_run else w.loop
    args = [*COMMON, *(w.dry if dry_run else w.args), "collector.total_frames=100000000", f"run.device={row.device}",
            *(w.learner() if row.kind == "learner" else loop),
            *([] if row.kind == "checkpoint" else [NO_CHECKPOINTS]),
            *(["optim.cudagraphs=true"] if row.graphs else []), *(["optim.compile=true"] if row.compiled else []),
            *(["replay.device=cuda"] if row.frames_on_gpu else []),
            *([f"run.torch_threads={cpu_threads}"] if row.device == "cpu" else [])]
    if dry_run and row.kind == "learner":  # 4 updates per frame
        args.append(f"optim.replay_ratio={4 * int(dict(a.split('=', 1) for a in w.dry)['optim.batch_size'])}")
    proc = subprocess.Popen([sys.executable, str(ROOT / "recipes" / f"{w.recipe}.py"), *args, f"run.dir={run_dir}"],
                            env=recipe_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    progress = run_dir / "progress.csv"
    started = time.monotonic()
    deadline, timed_from = started + 4 * seconds + 120, None  # room for start-up, compilation and capture
    while proc.poll() is None and time.monotonic() < deadline:
        timed = _timed(_rows(progress))
        if timed_from is None and timed:
            timed_from = time.monotonic()
        if timed_from is not None and time.monotonic() - timed_from >= seconds and len(timed) >= 3:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    timed = _timed(_rows(progress))
    if len(timed) < 2:
        row.note = (f"no update rate after {time.monotonic() - started:.0f} s (exit {proc.returncode})\n"
                    + "\n".join(out.strip().splitlines()[-FAILED_ROW_LINES:]))
        return
    row.rate = statistics.median(r["UpdatesPerSecond"] for r in timed[1:])
    row.phases, row.checkpoint_ms = _phases(timed)
    row.note = f"{len(timed) - 1} rows"


def plan(device: str) -> list[Row]:
    """The rows, GPU first (graphs, then eager), then the CPU's loop rows."""
    rows = []
    if device == "cuda":
        for w in WORKLOADS:
            if w.graphs:
                rows += [Row(w, "learner", "cuda", True), Row(w, "learner", "cuda", True, compiled=True),
                         Row(w, "loop", "cuda", True), Row(w, "checkpoint", "cuda", True)]
                if w.frames:
                    rows += [Row(w, "learner", "cuda", True, frames_on_gpu=True),
                             Row(w, "loop", "cuda", True, frames_on_gpu=True)]
            rows.append(Row(w, "loop", "cuda", False))
    for w in WORKLOADS:
        rows.append(Row(w, "loop", "cpu", False))
        if device == "cpu" and w.batch_size:  # the dry run covers the learner rows too
            rows.append(Row(w, "learner", "cpu", False))
    return rows


def update_rows(device: str, dry_run: bool, workdir: Path, seconds: float, cpu_threads: int,
                kinds: tuple[str, ...] = ("learner", "loop", "checkpoint"), say: Callable[[str], None] = print) -> None:
    """Run the rows of ``kinds`` (:func:`plan`) one at a time and print their tables."""
    rows = [row for row in plan(device) if row.kind in kinds]
    for i, row in enumerate(rows):
        run_row(row, workdir / f"upd{i}_{row.workload.recipe}_{row.kind}_{row.device}", seconds, dry_run, cpu_threads)
    cpu = {r.workload.label: r.rate for r in rows if r.device == "cpu" and r.kind == "loop"}
    say("| workload | row | device | CUDA graphs | updates/s | vs CPU loop | note |\n|---|---|---|---|---:|---:|---|")
    for r in rows:
        base = cpu.get(r.workload.label, float("nan"))
        ratio = f"{r.rate / base:.2f}x" if r.device == "cuda" and base > 0 else ""
        say(f"| {r.workload.label} | {r.name} | {r.device} | {r.graphs} | {r.rate:,.1f} | {ratio} | "
            f"{r.note.partition(chr(10))[0]} |")
    per_frame = 4 if dry_run else LEARNER_UPDATES
    say(f"\nLearner rows: {per_frame} updates per env frame and per log row. CPU rows: {cpu_threads} torch "
        "threads, run after the GPU rows.\n\nWhere the loop's time goes, microseconds per update (wall time of "
        "training between the first timed row and the last):\n")
    say("| workload | row | device | CUDA graphs | " + " | ".join(PHASES) + " | other | ms per checkpoint |")
    say("|---|---|---|---|" + "---:|" * (len(PHASES) + 2))
    for r in rows:
        if r.phases is not None:
            cells = " | ".join(f"{r.phases[p]:,.0f}" for p in (*PHASES, "other"))
            ckpt = f"{r.checkpoint_ms:,.1f}" if r.kind == "checkpoint" else ""
            say(f"| {r.workload.label} | {r.name} | {r.device} | {r.graphs} | {cells} | {ckpt} |")
    for r in rows:
        if r.note.count("\n"):
            output = r.note.partition("\n")[2]
            say(f"\n{r.workload.label}, {r.name} on {r.device} (CUDA graphs {r.graphs}):\n{output}")
    if missing := [f"{r.workload.label} {r.name} on {r.device}" for r in rows if not r.rate > 0]:
        raise RuntimeError(f"no update rate for {', '.join(missing)}")
