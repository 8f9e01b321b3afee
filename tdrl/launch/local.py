"""The local launcher: queue every run of a sweep over this machine's hardware slots (rlpyt's run_experiments).

Each run is its own process, ``python <recipe> key=value ... run.dir=<run dir>``, pinned to its slot with the
slot's environment, logging to ``<run dir>/launch.log``; when it ends the next run takes its slot, and a failed
run is recorded without stopping the others. The experiment root gets rlpyt's ``experiments_tree.txt`` and
``num_launched.txt`` and ``sweep.json`` (every run's variant, state, exit code, slot and log, read by ``status``).
Stopping the launcher (Ctrl-C, SIGTERM) stops its runs' process groups; a launcher killed outright takes its runs
along (parent-death signal). Runs with a ``summary.json`` are skipped unless ``rerun_done``; the others resume.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tdrl.launch.slots import Slot
from tdrl.launch.status import check_not_running, format_status, sweep_status
from tdrl.launch.sweep import RunSpec, SweepPlan
from tdrl.launch.variants import save_variant
from tdrl.utils.files import write_json_atomic
from tdrl.utils.process import die_with_parent

__all__ = ["RunOutcome", "launch_local"]

LOG_NAME = "launch.log"


@dataclass
class RunOutcome:
    """How one run of a local sweep ended."""

    run: RunSpec
    state: str
    """``completed``, ``failed`` or ``skipped`` (done before)."""
    returncode: int | None
    slot: Slot | None = None
    wall_s: float = 0.0

    @property
    def log(self) -> Path:
        """The run's output, ``<run dir>/launch.log``."""
        return self.run.run_dir / LOG_NAME


def format_tree(names: list[str]) -> str:
    """Indented tree of slash-separated run names (``a/b/run_0`` ...); siblings keep first-seen order."""
    tree: dict[str, dict] = {}
    for name in names:
        node = tree
        for part in name.split("/"):
            node = node.setdefault(part, {})
    lines: list[str] = []

    def walk(node: dict[str, dict], depth: int) -> None:
        for part, children in node.items():
            lines.append("  " * depth + part + ("/" if children else ""))
            walk(children, depth + 1)

    walk(tree, 0)
    return "\n".join(lines)


def write_root_files(plan: SweepPlan, details: list[str], launched: int = 0) -> None:
    """rlpyt's ``experiments_tree.txt`` (``details``, then the tree of run directories) and ``num_launched.txt``."""
    plan.exp_dir.mkdir(parents=True, exist_ok=True)
    n = len({r.log_dir for r in plan.runs})
    header = [f"Number of settings (experiments) to run: {n}  ({len(plan.runs)} runs).", f"Recipe: {plan.recipe}"]
    tree = format_tree([r.name for r in plan.runs])
    (plan.exp_dir / "experiments_tree.txt").write_text("\n".join([*header, *details, "", tree]) + "\n")
    _write_launched(plan, launched)


def _write_launched(plan: SweepPlan, launched: int) -> None:
    text = f"Experiments launched so far: {launched} out of {len(plan.runs)}.\n"
    (plan.exp_dir / "num_launched.txt").write_text(text)


def _start(run: RunSpec, plan: SweepPlan, slot: Slot, python: str) -> tuple[subprocess.Popen, IO[bytes]]:
    save_variant(run.variant, run.run_dir)
    log = open(run.run_dir / LOG_NAME, "ab")
    log.write(f"# tdrl launch {time.strftime('%Y-%m-%d %H:%M:%S')} slot {slot.index} ({slot.describe()})\n".encode())
    log.flush()
    process = subprocess.Popen(
        run.command(plan.recipe, python), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**os.environ, **slot.env()},
        start_new_session=True,  # its own process group: stopping the sweep stops the run's workers too
        preexec_fn=lambda: _in_child(slot),
    )
    return process, log


def _in_child(slot: Slot) -> None:
    """Runs in the run's process before exec: pin it to the slot, and have it get SIGTERM if the launcher dies."""
    slot.pin()
    die_with_parent(signal.SIGTERM)  # no orphan runs


def _stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, n: int = 8) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join("    " + line for line in lines[-n:])


def _queue_runs(plan: SweepPlan, records: list[dict[str, Any]], outcomes: dict[int, RunOutcome],
        rerun_done: bool) -> deque[RunSpec]:
    """The runs to launch, in plan order; those done before (unless ``rerun_done``) go to ``outcomes`` as skipped.
    Marks each run's manifest record queued or skipped."""
    queue: deque[RunSpec] = deque()
    for run in plan.runs:
        records[run.index].update(state="queued", log=str(run.run_dir / LOG_NAME))
        if run.is_done() and not rerun_done:
            outcomes[run.index] = RunOutcome(run, "skipped", None)
            records[run.index]["state"] = "skipped"
        else:
            queue.append(run)
    return queue


def _end_run(entry: tuple[RunSpec, Slot, subprocess.Popen, IO[bytes], float], record: dict[str, Any]) -> RunOutcome:
    """The outcome of a run whose process ended (closing its log), recorded in its manifest ``record``."""
    run, slot, process, log, t0 = entry
    log.close()
    rc = process.returncode
    outcome = RunOutcome(run, "completed" if rc == 0 else "failed", rc, slot, time.monotonic() - t0)
    record.update(state=outcome.state, returncode=rc, ended=time.time(), wall_s=round(outcome.wall_s, 2))
    return outcome


def _report_end(outcome: RunOutcome, out: IO[str]) -> None:
    name = outcome.run.name
    if outcome.returncode == 0:
        print(f"  done   {name:<40} {outcome.wall_s:.1f}s", file=out, flush=True)
    else:
        tail = _tail(outcome.log)
        print(f"  FAILED {name:<40} exit {outcome.returncode}; log: {outcome.log}\n{tail}", file=out, flush=True)


def launch_local(
    plan: SweepPlan, slots: list[Slot], python: str | None = None, poll_s: float = 0.2, rerun_done: bool = False,
    out: IO[str] | None = None,
) -> list[RunOutcome]:
    """Run every run of ``plan`` over ``slots``, one run per slot at a time, and wait for all of them.

    ``slots`` (:func:`tdrl.launch.slots.make_slots`) set the concurrency; ``python`` runs each recipe (``None``: this
    process's interpreter, ``sys.executable``); ``rerun_done`` also runs those with a
    ``summary.json`` (they resume from their last checkpoint); progress lines and the status table go to ``out``.
    Returns one :class:`RunOutcome` per run, in plan order; a failed run does not raise.

    Raises:
        SweepError: an earlier launch of this sweep is still running some of its runs.
        KeyboardInterrupt: Ctrl-C or SIGTERM, after the running runs were stopped and recorded as interrupted.
    """
    out = out or sys.stdout
    python = python or sys.executable
    if not slots:
        raise ValueError("launch_local needs at least one slot")
    check_not_running(plan)
    slot_line = f"Slots: {len(slots)} ({'; '.join(s.describe() for s in slots)})"
    write_root_files(plan, [f"Experiment manager process ID: {os.getpid()}.", slot_line])
    manifest = plan.manifest("local")
    manifest.update(launcher_pid=os.getpid(), slots=[s.describe() for s in slots])
    records = manifest["runs"]
    outcomes: dict[int, RunOutcome] = {}
    queue = _queue_runs(plan, records, outcomes, rerun_done)
    manifest_path = plan.exp_dir / "sweep.json"
    write_json_atomic(manifest_path, manifest)
    free = list(slots)
    running: dict[int, tuple[RunSpec, Slot, subprocess.Popen, IO[bytes], float]] = {}
    launched = 0
    print(f"sweep '{plan.sweep.name}': {len(queue)} runs over {len(slots)} slots -> {plan.exp_dir}", file=out)
    in_main_thread = threading.current_thread() is threading.main_thread()  # signal handlers live there
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if in_main_thread else None  # as Ctrl-C
    try:
        while queue or running:
            while queue and free:
                run, slot = queue.popleft(), free.pop(0)
                process, log = _start(run, plan, slot, python)
                running[run.index] = (run, slot, process, log, time.monotonic())
                launched += 1
                _write_launched(plan, launched)
                records[run.index].update(state="running", pid=process.pid, slot=slot.describe(), started=time.time())
                write_json_atomic(manifest_path, manifest)
                print(f"  start  {run.name:<40} {slot.describe()}", file=out, flush=True)
            time.sleep(poll_s)
            for index in [i for i, (_, _, p, _, _) in running.items() if p.poll() is not None]:
                entry = running.pop(index)
                free.append(entry[1])
                free.sort(key=lambda s: s.index)
                outcomes[index] = _end_run(entry, records[index])
                write_json_atomic(manifest_path, manifest)
                _report_end(outcomes[index], out)
    except KeyboardInterrupt:
        print(f"stopping {len(running)} running runs", file=out, flush=True)
        for index, (_, _, process, log, _) in running.items():
            _stop(process)
            log.close()
            records[index].update(state="interrupted", returncode=process.returncode, ended=time.time())
        write_json_atomic(manifest_path, manifest)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(format_status(sweep_status(plan.exp_dir)), file=out, flush=True)
    return [outcomes[r.index] for r in plan.runs]
