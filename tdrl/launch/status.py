"""Where every run of a sweep stands, and the results of the finished ones.

Reads only files and the SLURM queue, so it works from any shell, while the sweep runs or long after:
``<exp dir>/sweep.json`` (written by the launchers), each run's ``progress.csv`` (last row), ``summary.json``
(finished), ``launch_events.jsonl`` (starts and requeues of SLURM runs), submitit's result pickles (success or
the traceback) and ``squeue`` (the local cluster has no accounting database, so ``sacct`` is not used).
"""

from __future__ import annotations

import csv
import getpass
import json
import os
import pickle
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tdrl.config import flatten
from tdrl.launch.sweep import SweepError, SweepPlan
from tdrl.utils.process import pid_alive

__all__ = ["START_MARKER", "RunStatus", "check_not_running", "collect_results", "first_failed_task", "format_status",
    "ranks_on_hosts", "sweep_status"]

DEFAULT_COLUMNS = ("frames", "CumSteps", "eval/return_mean", "train/return_mean")
_FAILED = frozenset({"FAILED", "UNKNOWN", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "INTERRUPTED"})
TERMINAL = _FAILED | {"COMPLETED", "BOOT_FAIL", "DEADLINE", "SKIPPED"}
"""States after which a run will not change without being launched again."""
START_MARKER = "tdrl: job start"
"""What a SLURM job's batch script (written by :mod:`tdrl.launch.submit`) prints to its stderr on every start."""


@dataclass
class RunStatus:
    """One run's state and latest numbers."""

    name: str
    run_dir: Path
    state: str
    """COMPLETED, FAILED, RUNNING, PENDING, REQUEUED, CANCELLED, TIMEOUT, SKIPPED, INTERRUPTED, QUEUED, UNKNOWN."""
    job_id: str = ""
    starts: int = 0
    """How many times the run started (1 + requeues seen in ``launch_events.jsonl``; SLURM runs only)."""
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


def _format_table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain aligned text table; columns empty in every row are left out (except run and state)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    keep = [i for i, w in enumerate(widths) if any(r[i] for r in rows) or headers[i] in ("run", "state")]

    def line(cells: list[str]) -> str:
        return "  ".join(cells[i].ljust(widths[i]) for i in keep).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's ``summary.json`` (written when it finished), or None."""
    try:
        return json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None


def _last_progress_row(run_dir: Path) -> tuple[int, dict[str, str]] | None:
    """``(number of rows, last row)`` of the run's progress.csv, or None when there is none yet."""
    try:
        with open(Path(run_dir) / "progress.csv", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, csv.Error):
        return None
    if not rows:
        return None
    return len(rows), {k: v for k, v in rows[-1].items() if k is not None}


def _read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The run's launch_events.jsonl (tdrl.launch.job.record_event), without lines cut short by a killed job."""
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


def _count_starts(run_dir: Path) -> int:
    return sum(event.get("event") == "start" for event in _read_events(run_dir))


def slurm_query(*command: str) -> str | None:
    """stdout of a SLURM client command; None when there is no client or the controller does not answer."""
    if shutil.which(command[0]) is None:
        return None
    try:
        return subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


QueueEntry = tuple[str, str, float | None]
"""A job's ``(STATE, reason, start time)``: when it started, or is expected to (epoch seconds; None unknown)."""


def _epoch(slurm_time: str) -> float | None:
    try:
        return time.mktime(time.strptime(slurm_time, "%Y-%m-%dT%H:%M:%S"))  # SLURM prints local time
    except ValueError:  # N/A, Unknown
        return None


def squeue_states() -> dict[str, QueueEntry] | None:
    """``{job_id: (STATE, reason, start time)}`` for this user's jobs in the queue (array tasks as ``123_4``), or
    None."""
    text = slurm_query("squeue", "-h", "-r", "-t", "all", "-u", getpass.getuser(), "-o", "%i|%T|%r|%S")
    if text is None:
        return None
    fields = [line.strip().split("|") for line in text.splitlines()]
    return {f[0]: (f[1], f[2], _epoch(f[3])) for f in fields if len(f) == 4}


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


def _from_an_earlier_start(path: str, entry: QueueEntry | None) -> bool:
    """Whether a job's result was written before its current start: SLURM requeues a job whose node failed, so a
    job that is pending or running again has an earlier start's result until it writes its own."""
    if entry is None or entry[0] not in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "RUNNING"):
        return False
    started = entry[2]
    try:
        return started is None or os.path.getmtime(path) < started
    except OSError:
        return False


def _slurm_state(record: dict[str, Any], queue: dict[str, QueueEntry] | None, run_dir: Path) -> tuple[str, str]:
    job_id = record.get("job_id", "")
    result = _result(record.get("result", ""))
    if result is not None and not _from_an_earlier_start(record["result"], (queue or {}).get(job_id)):
        kind, value = result
        return ("COMPLETED", "") if kind == "success" else ("FAILED", _last_line(value))
    if not job_id and _read_summary(run_dir) is not None:
        return "SKIPPED", "finished before this submission"
    if queue is None:
        return "NO_QUEUE", "squeue did not answer"
    if job_id in queue:
        state, reason, _ = queue[job_id]
        return state, "" if reason in ("None", "") else reason
    if _read_summary(run_dir) is not None:
        return "COMPLETED", ""
    return "UNKNOWN", "not in the queue and no result (killed without a signal?)"


def first_failed_task(log: str, ranks_on: dict[str, list[int]] | None = None) -> str:
    """``rank 1 on tdrl-n2: Killed``: the first task that srun reported failing since the job's last start, from
    its stderr; ``""`` if none. That task is the cause: its peers fail after it (in a collective, or ended by
    ``--kill-on-bad-exit``), and one killed by a signal leaves no traceback of its own. A node that failed as a whole
    comes first (its tasks report nothing); ``ranks_on`` (host -> ranks) names its ranks."""
    section = log.rsplit(START_MARKER, 1)[-1]
    node = re.search(r"^srun: error: Node failure on (\S+)", section, re.M)
    if node:
        ranks = (ranks_on or {}).get(node.group(1), [])
        who = f"rank {','.join(map(str, ranks))} on " if ranks else "node "
        return f"{who}{node.group(1)}: node failure"
    found = re.search(r"^srun: error: (\S+): (tasks?) ([\d,\-]+): (.+)$", section, re.M)
    if not found:
        return ""
    host, word, tasks, what = found.groups()
    return f"{'rank' if word == 'task' else 'ranks'} {tasks} on {host}: {what.strip()}"


def ranks_on_hosts(run_dir: Path) -> dict[str, list[int]]:
    """Host -> ranks of the last start of a multi-task run, from the ``rank`` events in launch_events.jsonl."""
    latest: dict[int, tuple[int, str]] = {}
    for event in _read_events(run_dir):
        if event.get("event") == "rank" and event.get("restart", 0) >= latest.get(event["rank"], (-1, ""))[0]:
            latest[event["rank"]] = (event.get("restart", 0), event.get("host", ""))
    out: dict[str, list[int]] = {}
    for rank, (_, host) in sorted(latest.items()):
        out.setdefault(host, []).append(rank)
    return out


def _tail(path: str, size: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _name_failed_rank(state: str, error: str, log: str, run_dir: Path) -> tuple[str, str]:
    """For a failed multi-task job: the state and error, led by the rank that failed first."""
    failed = first_failed_task(_tail(log), ranks_on_hosts(run_dir)) if state in _FAILED else ""
    if not failed:
        return state, error
    if state == "UNKNOWN":  # rank 0 was ended before it could write a result
        return "FAILED", failed
    return "FAILED", f"{failed} (failed first); rank 0: {error}"


def sweep_status(exp_dir: str | os.PathLike) -> list[RunStatus]:
    """The state of every run recorded in ``<exp_dir>/sweep.json``.

    Raises:
        FileNotFoundError: ``exp_dir`` has no ``sweep.json`` (not launched with tdrl.launch).
    """
    manifest_path = Path(exp_dir) / "sweep.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no sweep.json in '{exp_dir}': not an experiment directory launched by tdrl")
    manifest = json.loads(manifest_path.read_text())
    slurm = manifest.get("backend") == "slurm"
    queue = squeue_states() if slurm else None
    launcher_alive = not slurm and pid_alive(manifest.get("launcher_pid"))
    resources = manifest.get("resources", {})
    multi_task = resources.get("nodes", 1) * resources.get("tasks_per_node", 1) > 1
    out = []
    for record in manifest["runs"]:
        run_dir = Path(record["run_dir"])
        if slurm:
            state, error = _slurm_state(record, queue, run_dir)
            log = record.get("stderr", "")
            if multi_task:
                state, error = _name_failed_rank(state, error, log, run_dir)
        else:
            state = record.get("state", "unknown").upper()
            error = f"exit {record['returncode']}" if state == "FAILED" else ""
            if state in ("RUNNING", "QUEUED") and not launcher_alive:
                state = "INTERRUPTED"
            log = record.get("log", "")
        rows, last_row = _last_progress_row(run_dir) or (0, {})
        out.append(
            RunStatus(
                name=record["name"], run_dir=run_dir, state=state, job_id=record.get("job_id", ""),
                starts=_count_starts(run_dir), rows=rows, last_row=last_row, summary=_read_summary(run_dir), log=log,
                error=error, variant=record.get("variant", {}), seed=record.get("seed"),
            )
        )
    return out


def _union_of_keys(dicts: list[dict[str, Any]]) -> list[str]:
    """Every key of ``dicts``, in first-seen order."""
    return list(dict.fromkeys(k for d in dicts for k in d))


def format_status(statuses: list[RunStatus], columns: list[str] | None = None) -> str:
    """A table: run, state, job, starts, progress rows, the chosen columns of the last progress row, log/error.

    ``columns``: progress.csv columns to show, ``["all"]`` for every one; default: those of ``DEFAULT_COLUMNS``
    present.
    """
    if columns == ["all"]:
        columns = _union_of_keys([s.last_row for s in statuses])
    elif not columns:
        present = {k for s in statuses for k in s.last_row}
        columns = [c for c in DEFAULT_COLUMNS if c in present]
    rows = [
        [s.name, s.state, s.job_id, str(s.starts) if s.starts else "", str(s.rows)]
        + [s.last_row.get(c, "") for c in columns]
        + [f"{s.error}  log: {s.log}" if s.state in _FAILED else ""]
        for s in statuses
    ]
    counts: dict[str, int] = {}
    for s in statuses:
        counts[s.state] = counts.get(s.state, 0) + 1
    table = _format_table(["run", "state", "job", "starts", "rows", *columns, "error / log"], rows)
    return table + "\n" + ", ".join(f"{n} {k.lower()}" for k, n in sorted(counts.items()))


def collect_results(exp_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """One flat row per run (name, state, seed, ``variant/<key>`` columns and its ``summary.json`` values), also
    saved as ``results.csv`` and ``results.json`` in ``exp_dir``."""
    rows = []
    for s in sweep_status(exp_dir):
        row: dict[str, Any] = {"run": s.name, "state": s.state, "seed": s.seed, "run_dir": str(s.run_dir)}
        row.update({f"variant/{k}": v for k, v in flatten(s.variant).items()})
        row.update({k: v for k, v in flatten(s.summary or {}).items() if not isinstance(v, (dict, list))})
        rows.append(row)
    with open(Path(exp_dir) / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=_union_of_keys(rows))
        writer.writeheader()
        writer.writerows(rows)
    (Path(exp_dir) / "results.json").write_text(json.dumps(rows, indent=2, default=str) + "\n")
    return rows


def check_not_running(plan: SweepPlan) -> None:
    """Refuse to launch runs that an earlier launch of this sweep is still running (two writers, one run dir).

    Raises:
        SweepError: naming the runs, their state and how to stop them.
    """
    if not (plan.exp_dir / "sweep.json").is_file():
        return
    names = {r.name for r in plan.runs}
    busy = [s for s in sweep_status(plan.exp_dir) if s.name in names and s.state not in TERMINAL | {"NO_QUEUE"}]
    if busy:
        listed = ", ".join(f"{s.name} ({s.state}{' job ' + s.job_id if s.job_id else ''})" for s in busy[:5])
        jobs = sorted({s.job_id.split("_")[0] for s in busy if s.job_id})
        how = f"scancel {' '.join(jobs)}" if jobs else "stop its launcher"
        raise SweepError(
            f"{len(busy)} run(s) of sweep '{plan.sweep.name}' are still active: {listed}; wait for them or {how} first"
        )
