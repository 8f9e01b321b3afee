"""Weights & Biases mirror of a run's log rows (wandb is imported only when this sink is built).

Offline by default (no account needed; ``wandb sync`` uploads later). The mode goes to ``wandb.init`` explicitly and
never into ``os.environ`` (TorchRL's ``WandbLogger(offline=True)`` sets ``WANDB_MODE`` for the whole process), and
an existing ``WANDB_MODE`` wins over the config so CI can switch W&B off. The run id is stored in
``<run_dir>/wandb_id.txt`` and passed back with ``resume="allow"``, so an online run continues after a requeue (W&B
cannot resume offline runs: each relaunch writes another ``offline-run-*`` with the same id). Env frames are the
step axis. The rows a resumed run re-runs (those after its checkpoint) were already sent: when the W&B run is closed
(finished or failed), the last step sent is kept in ``<run_dir>/wandb_step.txt``, and a relaunch sends only rows
and videos past it, so W&B gets each step once. It is written after ``finish`` returns, not after each row: W&B's
service buffers its files, and a launch killed outright (SIGKILL) loses the rows it had not written yet, so those
re-run rows are sent again rather than skipped (a row it had written appears twice then, with the same values).

Quiet: W&B's own lines (its banner, the run's history and summary, the ``wandb sync`` hint: about 40 ``wandb:``
lines per run) are silenced for the run: ``wandb.Settings(silent=True)`` given to ``wandb.init`` silences the run's
own printer, while W&B's errors and warnings (``wandb: ERROR``/``WARNING`` lines, a step logged out of order) still
print and its failures still raise; ``WANDB_SILENT`` would silence those too, process-wide. tdrl prints one line
instead when the W&B run closes: where its files are and how to upload them (offline: the ``wandb sync`` command,
over every launch of the run), or the run's URL (online).
``TDRL_DEBUG=1`` (:func:`tdrl.utils.console.debugging`) leaves W&B's output as W&B makes it.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from tdrl.config import ConfigError, LoggerConfig
from tdrl.utils.console import debugging
from tdrl.utils.files import write_atomic

__all__ = ["WandbSink", "check_wandb_credentials", "make_wandb_sink", "resolve_wandb_mode"]

ID_FILE = "wandb_id.txt"
STEP_FILE = "wandb_step.txt"
WandbMode = Literal["online", "offline", "disabled"]
_MODES: tuple[WandbMode, ...] = ("online", "offline", "disabled")


def resolve_wandb_mode(configured: str) -> WandbMode:
    """``WANDB_MODE`` from the environment if set (``dryrun`` means offline), else ``configured``; a mode other
    than online, offline, disabled is a :class:`~tdrl.config.ConfigError` naming where it came from."""
    env = os.environ.get("WANDB_MODE", "").strip().lower()
    mode, source = (env, "WANDB_MODE") if env else (configured, "logger.wandb_mode")
    mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)
    if mode not in _MODES:
        raise ConfigError(f"{source}={mode!r} is not one of {list(_MODES)}")
    return mode


def check_wandb_credentials(logger: LoggerConfig) -> None:
    """Raise :class:`~tdrl.config.ConfigError` when the run would log to W&B online and this machine has no
    credentials (``wandb login``, ``WANDB_API_KEY``): called before the run directory is made, so the launch fails
    in one line and leaves nothing behind. Asks ``wandb.login`` without prompting or contacting the server."""
    if not logger.wandb or resolve_wandb_mode(logger.wandb_mode) != "online":
        return
    import wandb

    if not wandb.login(prompt=False, verify=False):
        raise ConfigError("logger.wandb_mode=online needs W&B credentials and this machine has none: run `wandb "
                          "login` or set WANDB_API_KEY, or log offline (logger.wandb_mode=offline, `wandb sync` later)")


def _load_or_create_run_id(run_dir: Path) -> str:
    """The W&B run id stored in ``run_dir/wandb_id.txt``, created (8 chars of [a-z0-9]) on first use."""
    path = Path(run_dir) / ID_FILE
    if path.is_file():
        run_id = path.read_text().strip()
        if run_id:
            return run_id
    alphabet = string.ascii_lowercase + string.digits
    run_id = "".join(secrets.choice(alphabet) for _ in range(8))
    write_atomic(path, run_id + "\n")
    return run_id


class WandbSink:
    """Mirror log rows and videos to a W&B run (``mode`` online or offline; see :func:`make_wandb_sink`).

    W&B files go to ``run_dir/wandb`` unless ``WANDB_DIR`` is set; empty ``project``, ``entity``, ``group`` mean
    W&B's defaults / no group; ``config`` is logged as the run's config. Rows and videos at steps an earlier launch
    on ``run_dir`` already sent (up to :attr:`sent_before`) are skipped.
    """

    def __init__(self, *, run_dir: Path, run_id: str, mode: WandbMode, name: str, project: str, entity: str = "",
                 group: str = "", config: Mapping[str, Any] | None = None) -> None:
        import wandb

        self._wandb = wandb
        self.run_id = run_id
        self._step_file = Path(run_dir) / STEP_FILE
        self.sent_before = _read_step(self._step_file)
        """The last step earlier launches sent and closed (-1: none); rows up to it are re-runs."""
        self._last_sent = self.sent_before
        self.mode = mode
        self._run: Any = wandb.init(
            project=project or None, entity=entity or None, group=group or None, name=name, id=run_id, resume="allow",
            mode=mode, job_type="train", dir=os.environ.get("WANDB_DIR") or str(run_dir), config=dict(config or {}),
            reinit="create_new", settings=None if debugging() else wandb.Settings(silent=True),
        )
        self.sync_dir = Path(self._run.settings.sync_dir)
        """This launch's W&B files (``<wandb dir>/offline-run-<time>-<id>`` offline)."""
        self.url: str | None = self._run.url if mode == "online" else None
        self._run.define_metric("frames")
        self._run.define_metric("*", step_metric="frames")

    def write(self, row: Mapping[str, Any], step: int) -> None:
        """Log the row's values with ``frames=step``, unless an earlier launch sent that step."""
        if step <= self.sent_before:
            return
        data = {k: v for k, v in row.items() if v is not None}
        data["frames"] = step
        self._run.log(data)
        self._last_sent = max(self._last_sent, step)

    def add_video(self, key: str, path: Path, step: int) -> None:
        """Attach an mp4 (``wandb.Video(path)`` needs no moviepy), unless an earlier launch sent that step."""
        if step <= self.sent_before:
            return
        self._run.log({key: self._wandb.Video(str(path), format="mp4"), "frames": step})

    def set_summary(self, summary: Mapping[str, Any]) -> None:
        """Write final values into the W&B run summary."""
        for key, value in summary.items():
            self._run.summary[key] = value

    def close(self, exit_code: int = 0) -> None:
        """Finish the W&B run (its files are complete then), record the last step sent and print tdrl's line about
        it (:meth:`describe`); idempotent."""
        if self._run is not None:
            self._run.finish(exit_code=exit_code)
            self._run = None
            if self._last_sent > self.sent_before:
                write_atomic(self._step_file, f"{self._last_sent}\n")
            print(f"tdrl: {self.describe()}", flush=True)

    def describe(self) -> str:
        """Where this run's W&B data is: online, its URL; offline, the command that uploads it, naming every
        launch's ``offline-run-*`` directory of this run id in start order (``wandb sync`` sends the launches of a
        resumed run one after another, and each holds only the steps the launches before it had not sent)."""
        if self.mode == "online":
            return f"W&B run at {self.url}" if self.url else f"W&B run {self.run_id} logged online"
        pattern = re.compile(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(self.run_id)}(-\d+)?")
        launches = sorted(p for p in self.sync_dir.parent.glob(f"offline-run-*{self.run_id}*")
                          if p.is_dir() and pattern.fullmatch(p.name))
        if self.sync_dir not in launches:
            launches.append(self.sync_dir)
        return f"W&B run saved offline; upload it with: wandb sync {' '.join(shlex.quote(str(p)) for p in launches)}"


def _read_step(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):  # no file yet (or cut by a crash): nothing is skipped
        return -1


def make_wandb_sink(run_dir: Path, logger: LoggerConfig, config: Mapping[str, Any], name: str) -> WandbSink | None:
    """The run's W&B sink with its persisted id, or ``None`` when ``logger.wandb`` is off or the mode is disabled."""
    if not logger.wandb:
        return None
    mode = resolve_wandb_mode(logger.wandb_mode)
    if mode == "disabled":
        return None
    return WandbSink(run_dir=run_dir, run_id=_load_or_create_run_id(run_dir), mode=mode, name=name,
                     project=logger.project, entity=logger.entity, group=logger.group, config=config)
