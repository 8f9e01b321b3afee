"""Where every run of a sweep stands, and the results of the finished ones.

Reads only files and the SLURM queue, so it works from any shell, while the sweep runs or long after:
``<exp dir>/sweep.json`` (written by the launchers), each run's ``progress.csv`` (last row), ``summary.json``
(finished), ``launch_events.jsonl`` (starts and requeues of SLURM runs), submitit's result pickles (success or
the traceback) and ``squeue`` (pending, running, requeued; there is no accounting database on the local
cluster, so ``sacct`` is not used).
"""

from __future__ import annotations

import csv
import getpass
import json
import os
import pickle
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tdrl.config import flatten
from tdrl.launch.sweep import SweepError, SweepPlan
from tdrl.utils.process import pid_alive

__all__ = ["RunStatus", "check_not_running", "collect_results", "format_status", "format_table", "last_progress_row",
    "read_summary", "sweep_status"]

DEFAULT_COLUMNS = ("frames", "CumSteps", "eval/return_mean", "train/return_mean")
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
                      "DEADLINE", "SKIPPED", "UNKNOWN", "INTERRUPTED"})
"""States after which a run will not change without being launched again."""
_FAILED = ("FAILED", "UNKNOWN", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "INTERRUPTED")


@dataclass
class RunStatus:
    """One run's state and latest numbers."""

    name: str
    run_dir: Path
    state: str
    """COMPLETED, FAILED, RUNNING, PENDING, REQUEUED, CANCELLED, TIMEOUT, SKIPPED, INTERRUPTED, QUEUED, UNKNOWN."""
    job_id: str = ""
    starts: int = 0
    """How many times the run started (1 + requeues/relaunches seen in ``launch_events.jsonl``)."""
    rows: int = 0
    """Rows in progress.csv."""
    last_row: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    log: str = ""
    """stderr of the run (SLURM) or its launch.log (local)."""
    error: str = ""
    """Last line of the traceback or the exit code, for failed runs."""
    variant: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain aligned text table (no dependency on a table library)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    keep = [i for i, w in enumerate(widths) if any(r[i] for r in rows) or headers[i] in ("run", "state")]
    line = lambda cells: "  ".join(cells[i].ljust(widths[i]) for i in keep).rstrip()  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` (written when it finished), or None."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def last_progress_row(run_dir: Path) -> tuple[int, dict[str, str]] | None:
    """``(number of rows, last row)`` of the run's progress.csv, or None when there is none yet."""
    path = Path(run_dir) / "progress.csv"
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error):
        return None
    if not rows:
        return None
    return len(rows), {k: v for k, v in rows[-1].items() if k is not None}


def _events(run_dir: Path) -> list[dict[str, Any]]:
    try:
        lines = (Path(run_dir) / "launch_events.jsonl").read_text().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def slurm_query(*command: str) -> str | None:
    """stdout of a SLURM client command; None when there is no client or the controller does not answer."""
    if shutil.which(command[0]) is None:
        return None
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def squeue_states() -> dict[str, tuple[str, str]] | None:
    """``{job_id: (STATE, reason)}`` for this user's jobs in the queue (array tasks as ``123_4``), or None."""
    text = slurm_query("squeue", "-h", "-r", "-t", "all", "-u", getpass.getuser(), "-o", "%i|%T|%r")
    if text is None:
        return None
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            out[parts[0]] = (parts[1], parts[2])
    return out


def _result(path: str) -> tuple[str, Any] | None:
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - a half-written or foreign pickle is "no result yet"
        return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _slurm_state(record: dict[str, Any], queue: dict[str, tuple[str, str]] | None, run_dir: Path) -> tuple[str, str]:
    result = _result(record.get("result", ""))
    if result is not None:
        kind, value = result
        return ("COMPLETED", "") if kind == "success" else ("FAILED", _last_line(value))
    job_id = record.get("job_id", "")
    if not job_id and read_summary(run_dir) is not None:
        return "SKIPPED", "finished before this submission"
    if queue is None:
        return "NO_QUEUE", "squeue did not answer"
    if job_id in queue:
        state, reason = queue[job_id]
        return state, "" if reason in ("None", "") else reason
    if read_summary(run_dir) is not None:
        return "COMPLETED", ""
    return "UNKNOWN", "not in the queue and no result (killed without a signal?)"


def sweep_status(exp_dir: str | os.PathLike) -> list[RunStatus]:
    """The state of every run recorded in ``<exp_dir>/sweep.json``.

    Raises:
        FileNotFoundError: ``exp_dir`` has no ``sweep.json`` (not launched with tdrl.launch).
    """
    exp_dir = Path(exp_dir)
    manifest_path = exp_dir / "sweep.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no sweep.json in '{exp_dir}': not an experiment directory launched by tdrl")
    manifest = json.loads(manifest_path.read_text())
    backend = manifest.get("backend", "local")
    queue = squeue_states() if backend == "slurm" else None
    launcher_alive = pid_alive(manifest.get("launcher_pid")) if backend == "local" else False
    out = []
    for record in manifest["runs"]:
        run_dir = Path(record["run_dir"])
        if backend == "slurm":
            state, error = _slurm_state(record, queue, run_dir)
            log = record.get("stderr", "")
        else:
            state = record.get("state", "unknown").upper()
            error = f"exit {record['returncode']}" if state == "FAILED" else ""
            if state in ("RUNNING", "QUEUED") and not launcher_alive:
                state = "INTERRUPTED"
            log = record.get("log", "")
        progress = last_progress_row(run_dir)
        events = _events(run_dir)
        out.append(
            RunStatus(
                name=record["name"], run_dir=run_dir, state=state, job_id=record.get("job_id", ""),
                starts=sum(e.get("event") == "start" for e in events), rows=progress[0] if progress else 0,
                last_row=progress[1] if progress else {}, summary=read_summary(run_dir), log=log, error=error,
                variant=record.get("variant", {}), seed=record.get("seed"),
            )
        )
    return out


def _pick_columns(statuses: list[RunStatus], columns: list[str] | None) -> list[str]:
    if columns == ["all"]:
        keys: list[str] = []
        for s in statuses:
            keys += [k for k in s.last_row if k not in keys]
        return keys
    if columns:
        return columns
    present = {k for s in statuses for k in s.last_row}
    return [c for c in DEFAULT_COLUMNS if c in present]


def format_status(statuses: list[RunStatus], columns: list[str] | None = None) -> str:
    """A table: run, state, job, starts, progress rows, the chosen columns of the last progress row, log/error."""
    cols = _pick_columns(statuses, columns)
    rows = []
    for s in statuses:
        failed = s.state in _FAILED
        rows.append(
            [s.name, s.state, s.job_id, str(s.starts) if s.starts else "", str(s.rows)]
            + [s.last_row.get(c, "") for c in cols]
            + [f"{s.error}  log: {s.log}" if failed else ""]
        )
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    table = format_table(["run", "state", "job", "starts", "rows", *cols, "error / log"], rows)
    return table + "\n" + ", ".join(f"{n} {k.lower()}" for k, n in sorted(counts.items()))


def collect_results(exp_dir: str | os.PathLike, write: bool = True) -> list[dict[str, Any]]:
    """One flat row per run: name, state, seed, ``variant/<key>`` columns and its ``summary.json`` values.

    With ``write``, also saves ``results.csv`` and ``results.json`` in ``exp_dir`` (the finished runs' summaries
    side by side, ready for a table or ``tdrl plot``).
    """
    statuses = sweep_status(exp_dir)
    rows = []
    for s in statuses:
        row: dict[str, Any] = {"run": s.name, "state": s.state, "seed": s.seed, "run_dir": str(s.run_dir)}
        row.update({f"variant/{k}": v for k, v in flatten(s.variant).items()})
        row.update({k: v for k, v in flatten(s.summary or {}).items() if not isinstance(v, (dict, list))})
        rows.append(row)
    if write:
        exp_dir = Path(exp_dir)
        keys: list[str] = []
        for row in rows:
            keys += [k for k in row if k not in keys]
        with open(exp_dir / "results.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
        (exp_dir / "results.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return rows


def check_not_running(plan: SweepPlan) -> None:
    """Refuse to launch runs that an earlier launch of this sweep is still running (two writers, one run dir).

    Raises:
        SweepError: naming the runs, their state and how to stop them.
    """
    if not (plan.exp_dir / "sweep.json").is_file():
        return
    names = {r.name for r in plan.runs}
    busy = [s for s in sweep_status(plan.exp_dir) if s.name in names and s.state not in TERMINAL]
    busy = [s for s in busy if s.state != "NO_QUEUE"]
    if busy:
        listed = ", ".join(f"{s.name} ({s.state}{' job ' + s.job_id if s.job_id else ''})" for s in busy[:5])
        jobs = sorted({s.job_id.split("_")[0] for s in busy if s.job_id})
        how = f"scancel {' '.join(jobs)}" if jobs else "stop its launcher"
        raise SweepError(
            f"{len(busy)} run(s) of sweep '{plan.sweep.name}' are still active: {listed}; wait for them or {how} first"
        )
