"""A run: its directory, config files, ``debug.log``, ``progress.csv``, metric sinks, checkpoints and resume.

rlpyt's ``logger_context`` plus atomic checksummed checkpoints, exact resume and W&B. Typical use::

    run = Run.open(config=cfg, run=cfg.run, logger=cfg.logger, checkpoint=cfg.checkpoint, name="ppo")
    # build envs, models, optimizers, replay: the same calls, consuming the same RNG, fresh or resumed
    state = run.load_checkpoint(extra_readers={"replay": buffer.loads})   # None on a fresh run
    start = 0 if state is None else state["itr"] + 1   # and load the model/optimizer state dicts from state
    for itr in range(start, n_itr):
        run.log(summarize_records(episodes, "train/"), step=frames, iteration=itr)  # a Bookkeeper adds rates
        run.save_checkpoint({"model": ..., "itr": itr}, itr, step=frames,
                            extra_writers={"replay": buffer.checkpoint_writer()})
    run.finish({"eval/return_mean": last_eval_return})

Run directory (``<run.root>/<yyyymmdd>/<hhmmss>_<name>/run_<seed>/`` or ``run.dir``)::

    config.json     the resolved config (read back to check a relaunch uses the same one)
    params.json     the same plus ``name`` and ``run_ID`` (rlpyt's file)
    progress.csv    one row per log call: rlpyt's columns, then the metrics (see tdrl.log.progress)
    debug.log       everything printed while the run is open, appended across relaunches
    checkpoints/    itr_<N>/ checkpoint directories (see tdrl.ckpt)
    wandb_id.txt    the W&B run id, reused on resume; wandb/ holds W&B's files (offline: ``wandb sync`` them)
    wandb_step.txt  the last step sent to W&B (at its close): rows re-run after a resume are not sent twice
    videos/         evaluation videos (:meth:`Run.log_video`)
    summary.json    final numbers: frames, wall_s, eval/return_mean, and what the caller adds

Exact resume at iteration boundaries: launching again on an explicit ``run.dir`` holding ``config.json`` resumes
it; the saved config must match (see :func:`tdrl.log.rundir.check_resume_config`) unless ``run.force``. A finished
run (``summary.json``) is not relaunched: :meth:`Run.open` raises :class:`tdrl.log.rundir.RunFinished`, changing
nothing, unless ``run.force``. An explicit ``run.dir`` that is a folder of other files is refused unless
``run.force``.
``load_checkpoint`` restores the newest valid checkpoint, its RNG states and the logger's position (later
progress.csv rows are dropped: they are re-run). Call it after building everything, right before the loop, so
RNG draws made while building are the same in both runs. The checkpoints are verified when the run is opened,
before anything is written: a corrupt newest one is skipped for the one before (the default snapshot mode keeps
two); a directory whose checkpoints all fail stops with a :class:`tdrl.log.rundir.RunDirError` naming them and
changes nothing, unless ``run.force`` (then it starts over). A run killed before its first checkpoint starts over.
One process owns a run directory (an ``flock``); in distributed training only rank 0 opens the Run.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tdrl.ckpt import Checkpointer, CheckpointError, CheckpointInfo, LinkingWriter, PathWriter, StrictResumeError
from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig
from tdrl.log.progress import ProgressCSV, metric_value
from tdrl.log.rundir import (
    RunDirError,
    check_not_finished,
    check_resume_config,
    check_writable,
    claim_run_dir,
    config_dict,
    lock_run_dir,
    save_config,
    sign_lock,
)
from tdrl.log.sinks import ConsoleSink, Sink, make_tensorboard_sink
from tdrl.log.tee import DebugLog
from tdrl.log.video import write_video
from tdrl.log.wandb_sink import check_wandb_credentials, make_wandb_sink
from tdrl.utils.files import write_json_atomic
from tdrl.utils.interrupt import note_run_dir
from tdrl.utils.seeding import rng_state, set_rng_state

__all__ = ["RESERVED_COLUMNS", "WALL_TIME_COLUMNS", "Run", "is_wall_time_column"]

RESERVED_COLUMNS: tuple[str, ...] = ("Iteration", "CumSteps", "CumTime", "StepsPerSecond", "NewCompletedTrajs",
                                     "CumCompletedTrajs", "CumUpdates", "UpdatesPerSecond", "ReplayRatio",
                                     "CumReplayRatio")
"""rlpyt's columns, first in every row: ``Iteration`` and ``CumSteps`` from :meth:`Run.log`'s arguments, the rest
computed by the trainer's ``tdrl.train.Bookkeeper`` (the one place counters and rates are computed)."""
WALL_TIME_COLUMNS: frozenset[str] = frozenset({"CumTime", "StepsPerSecond", "UpdatesPerSecond"})
"""Columns that depend on wall-clock time, hence differ between otherwise identical runs."""

_POSITION_FORMAT = 1


def _check_resumable(directory: Path, checkpointer: Checkpointer, progress: ProgressCSV, *, force: bool) -> None:
    """Verify the checkpoints before a relaunch writes anything (the verdicts are remembered for loading).

    Raises :class:`RunDirError` when checkpoints exist but none verifies (a run that never wrote one starts over:
    nothing is lost), unless ``force``; :class:`StrictResumeError` when the newest fails under strict resume.
    """
    newest, problems = checkpointer.newest_valid()
    if problems and checkpointer.strict:
        raise StrictResumeError(f"{problems[0]}; strict resume is on (checkpoint.strict_resume=true); nothing was "
                                "changed: relaunch without it to fall back to the previous valid checkpoint")
    if newest is None and problems and not force:
        raise RunDirError(
            f"cannot resume {directory}: no checkpoint is loadable ({'; '.join(problems)}); its "
            f"{progress.num_rows} progress rows would be lost, so nothing was changed. Restore a checkpoint, or "
            "relaunch with run.force=true to start over (the corrupt ones are then moved to checkpoints/corrupt/)"
        )


def is_wall_time_column(key: str) -> bool:
    """True for columns measured in wall-clock time (excluded when comparing runs)."""
    return key in WALL_TIME_COLUMNS or key.startswith("time/")


class Run:
    """An open run directory with its progress.csv, sinks (mirrors of each row), checkpointer and ``debug.log``
    tee. Build it with :meth:`Run.open`; ``lock`` is the directory's open lock file, released by :meth:`close`;
    ``force`` (``run.force``): when no checkpoint loads, :meth:`load_checkpoint` starts over instead of raising.
    """

    def __init__(self, directory: Path, *, name: str, resumed: bool, checkpointer: Checkpointer,
                 progress: ProgressCSV, sinks: Sequence[Sink] = (), debug_log: DebugLog | None = None,
                 wandb_id: str | None = None,
                 lock: IO[str] | None = None, force: bool = False) -> None:
        self.dir = Path(directory)
        self.name = name
        self.resumed = resumed
        self.checkpointer = checkpointer
        self.progress = progress
        self.sinks = list(sinks)
        self.wandb_id = wandb_id
        self.last_checkpoint: CheckpointInfo | None = None
        self._debug_log = debug_log
        self._lock = lock
        self._force = force
        self._position_known = not resumed  # a resumed run learns its position from load_checkpoint
        self._closed = False
        self._summary: dict[str, Any] | None = None
        self._set_counters({})

    @classmethod
    def open(cls, config: Any, *, run: RunConfig | None = None, logger: LoggerConfig | None = None,
             checkpoint: CheckpointConfig | None = None, name: str = "run", total_frames: int | None = None,
             sinks: Sequence[Sink] = (), tee: bool = True) -> Run:
        """Create or resume a run directory and open its logs and sinks; prints the directory.

        ``config`` is the recipe's resolved config (dataclass or mapping), saved as config.json/params.json and
        logged to W&B; ``run``, ``logger``, ``checkpoint`` are its sections: by default the config's own (a recipe
        calls ``Run.open(cfg, name="dqn")``), else tdrl's defaults. ``name`` is used when ``run.name`` is empty;
        ``total_frames`` is the progress bar's total (default: the config's ``collector.total_frames``);
        ``sinks`` are written after the built-in ones; ``tee`` copies stdout/stderr into ``debug.log``.

        Raises:
            tdrl.log.rundir.RunDirError: the directory cannot be created or written, another live process has it
                open, or it holds checkpoints of which none verifies (unless ``run.force``: then it starts over).
            tdrl.config.ConfigError: resuming a directory whose saved config differs (lists the keys), unless
                ``run.force``.
            tdrl.ckpt.StrictResumeError: the newest checkpoint is corrupt and ``checkpoint.strict_resume`` is on.
            tdrl.log.rundir.RunFinished: the run there finished (``summary.json``), and the config is the same
                (``run.force`` relaunches it, e.g. with a larger budget); a recipe says so in one line, exit 0.
            tdrl.utils.errors.UserError: ``logger.wandb_mode=online`` without W&B credentials (before the directory
                is made).
            ValueError: a bad ``checkpoint.snapshot_mode``/``snapshot_gap`` or W&B mode.

        A resume that is refused changes nothing in the run directory.
        """
        run = run if run is not None else getattr(config, "run", None)
        if not isinstance(run, RunConfig):
            raise TypeError("Run.open needs run=RunConfig(dir=...), or a config with a run section")
        logger = logger if logger is not None else getattr(config, "logger", LoggerConfig())
        checkpoint = checkpoint if checkpoint is not None else getattr(config, "checkpoint", CheckpointConfig())
        if total_frames is None:
            total_frames = getattr(getattr(config, "collector", None), "total_frames", None)
        name = run.name or name
        cfg = config_dict(config)
        check_wandb_credentials(logger)  # before the directory exists: a refused launch leaves nothing behind
        directory, resumed = claim_run_dir(run, name)
        lock = lock_run_dir(directory)
        debug_log: DebugLog | None = None
        built: list[Sink] = []
        try:
            checkpointer = Checkpointer(directory / "checkpoints", snapshot_mode=checkpoint.snapshot_mode,
                                        snapshot_gap=checkpoint.snapshot_gap, strict=checkpoint.strict_resume)
            progress = ProgressCSV(directory / "progress.csv")
            defaults = None if isinstance(config, Mapping) else config_dict(type(config)())  # the recipe's defaults
            diff = check_resume_config(directory, cfg, force=run.force, defaults=defaults) if resumed else {}
            if resumed:
                _check_resumable(directory, checkpointer, progress, force=run.force)
            if resumed and not run.force:
                check_not_finished(directory)  # the same config on a finished run: nothing to do
            # from here on the launch goes ahead and writes
            check_writable(directory)
            sign_lock(lock)
            note_run_dir(directory)  # an interrupted launch names it in the command that resumes it
            save_config(directory, cfg, name=name, seed=run.seed, diff=diff)
            debug_log = DebugLog(directory / "debug.log") if tee else None
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            print(f"tdrl: {'resuming' if resumed else 'new'} run {name!r} in {directory} ({stamp})", flush=True)
            if diff:
                warnings.warn(f"run.force=true: resuming despite changes in {sorted(diff)}", stacklevel=2)
            bar_stream = debug_log.terminal_stderr if debug_log else None
            built.append(ConsoleSink(name=name, total_frames=total_frames, progress_bar=logger.progress_bar,
                                     bar_stream=bar_stream))
            wandb = make_wandb_sink(directory, logger, cfg, f"{name}-s{run.seed}")
            tensorboard = make_tensorboard_sink(directory / "tensorboard") if logger.tensorboard else None
            built += [s for s in (wandb, tensorboard) if s is not None]
        except BaseException:
            for closable in (*built, debug_log, lock):
                if closable is not None:
                    closable.close()
            raise
        return cls(directory, name=name, resumed=resumed, checkpointer=checkpointer, progress=progress,
                   sinks=[*built, *sinks], debug_log=debug_log,
                   wandb_id=wandb.run_id if wandb is not None else None, lock=lock, force=run.force)

    def log(self, metrics: Mapping[str, Any], *, step: int, iteration: int | None = None) -> dict[str, Any]:
        """Write one progress.csv row and mirror it to every sink; returns the row as written.

        The row is ``Iteration`` (if given), ``CumSteps`` (= ``step``, cumulative env frames), then ``metrics``
        (``{key: number}``; tensors and numpy scalars are converted, ``None`` leaves the cell empty), which from a
        trainer start with the rest of rlpyt's columns (``CumTime``, ``StepsPerSecond``..., see
        :data:`RESERVED_COLUMNS`), computed by its ``Bookkeeper``. Nothing is computed here.

        Raises:
            ValueError: a metric is called ``Iteration`` or ``CumSteps``.
            TypeError: a metric value is not a real scalar (the message names the key).
        """
        if self._closed:
            raise RuntimeError(f"run {self.dir} is finished; cannot log")
        if not self._position_known:
            warnings.warn(f"resumed run {self.dir} logged before load_checkpoint(); progress.csv starts over",
                          stacklevel=2)
            self._set_position(None)
        row: dict[str, Any] = {} if iteration is None else {"Iteration": int(iteration)}
        row["CumSteps"] = int(step)
        for key, value in metrics.items():
            if key in ("Iteration", "CumSteps"):
                raise ValueError(f"metric key {key!r} is a column Run.log writes from its arguments; rename it")
            row[key] = metric_value(key, value)
        self.progress.write(row)
        for sink in list(self.sinks):
            try:
                sink.write(row, int(step))
            except Exception as e:  # noqa: BLE001 - a mirror failing must not stop training
                warnings.warn(f"log sink {type(sink).__name__} failed ({e!r}); disabling it", stacklevel=2)
                self.sinks.remove(sink)
        self._step = int(step)
        self._last_values.update({k: v for k, v in row.items() if v is not None})
        return row

    def log_video(self, frames: Any, *, step: int, key: str = "eval/video", fps: int = 30) -> Path:
        """Encode ``frames`` (see :func:`tdrl.log.video.write_video`) to ``videos/<key>_<step>.mp4`` (the key's last
        component names the file) and attach the file to the sinks (W&B)."""
        path = self.dir / "videos" / f"{key.rsplit('/', 1)[-1]}_{int(step):012d}.mp4"
        write_video(frames, path, fps=fps)
        for sink in self.sinks:
            sink.add_video(key, path, int(step))
        return path

    def will_checkpoint(self, iteration: int) -> bool:
        """Whether :meth:`save_checkpoint` writes anything after ``iteration`` under ``checkpoint.snapshot_mode``:
        trainers gather a checkpoint's state only when it does."""
        return self.checkpointer.will_save(iteration)

    def save_checkpoint(self, state: Mapping[str, Any], iteration: int, *, step: int | None = None,
                        extra_writers: Mapping[str, PathWriter | LinkingWriter] | None = None) -> Path | None:
        """Checkpoint ``state`` (tensors, state dicts, python values) with the logger position and RNG states.

        ``iteration`` (just completed) names the checkpoint and decides the snapshot mode; ``step`` is the env
        frames so far (default: the last logged step); ``extra_writers`` (``{name: writer(dir)}``, or a
        :class:`tdrl.ckpt.LinkingWriter` that shares unchanged files with the previous checkpoint) are components
        that write their own files (replay). Returns the checkpoint directory, or ``None`` when the snapshot mode
        skips it. Raises :class:`tdrl.ckpt.CheckpointError` if the write failed; earlier checkpoints are intact.
        """
        if not self.checkpointer.will_save(iteration):
            return None
        step = self._step if step is None else int(step)
        self.progress.sync()  # the rows this checkpoint counts are on disk before it is published
        position = {
            "format": _POSITION_FORMAT,
            "iteration": int(iteration),
            "step": self._step,
            "checkpoint_step": step,
            "progress_rows": self.progress.num_rows,
            "cum_time": self._time_offset + (time.perf_counter() - self._t0),
            "last_values": dict(self._last_values),
            "wandb_id": self.wandb_id,
        }
        payload = {"state": dict(state), "run": position, "rng": rng_state()}
        path = self.checkpointer.save(payload, iteration, extra_writers=extra_writers)
        assert path is not None  # will_save(iteration) said it saves
        self.last_checkpoint = CheckpointInfo(path, int(iteration))
        return path

    def load_checkpoint(self, *, map_location: Any = "cpu",
                        extra_readers: Mapping[str, PathWriter] | None = None) -> dict[str, Any] | None:
        """Load the newest valid checkpoint's ``state`` (as given to :meth:`save_checkpoint`) and restore the logger
        position and the RNG states captured at save time; ``None`` if there is none.

        A corrupt newer checkpoint is skipped with a loud warning for the previous valid one (an error with
        ``checkpoint.strict_resume``). With no checkpoint, a resumed run's progress.csv starts over.
        ``extra_readers`` (``{name: reader(dir)}``) match the ``extra_writers`` used when saving.

        Raises:
            tdrl.log.rundir.RunDirError: every checkpoint failed to load (verified when the run was opened, but
                ``state.pt`` does not unpickle), unless ``run.force``.
        """
        had_checkpoints = bool(self.checkpointer.list())
        loaded = self.checkpointer.load_latest(map_location=map_location, extra_readers=extra_readers)
        if loaded is None:
            if had_checkpoints and not self._force:
                raise RunDirError(f"no checkpoint in {self.checkpointer.directory} loads (moved to corrupt/, see the "
                                  "warnings); relaunch with run.force=true to start over")
            if self.resumed and self.progress.num_rows:
                print(f"tdrl: no valid checkpoint in {self.checkpointer.directory}; starting over", flush=True)
            self._set_position(None)
            return None
        payload, info = loaded
        if not isinstance(payload, dict) or not {"state", "run", "rng"} <= payload.keys():
            raise CheckpointError(f"{info.path} was not written by Run.save_checkpoint (keys state/run/rng)")
        self._set_position(payload["run"])
        set_rng_state(payload["rng"])
        self.last_checkpoint = info
        print(f"tdrl: resumed from {info.path.name} (iteration {info.iteration}, {self._step:,} frames, "
              f"{self.progress.num_rows} progress rows)", flush=True)
        return payload["state"]

    def _set_position(self, position: Mapping[str, Any] | None) -> None:
        """Continue counters from a checkpoint's position (``None``: from zero) and cut progress.csv to match."""
        pos = dict(position or {})
        rows = int(pos.get("progress_rows", 0))
        if self.progress.num_rows > rows:
            self.progress.truncate(rows)
        elif self.progress.num_rows < rows:
            warnings.warn(f"{self.progress.path} has {self.progress.num_rows} rows but the checkpoint counted {rows}; "
                          "rows are missing (was the file edited?)", stacklevel=3)
        self._set_counters(pos)
        self._position_known = True

    def _set_counters(self, pos: Mapping[str, Any]) -> None:
        self._step = int(pos.get("step", 0))
        self._time_offset = float(pos.get("cum_time", 0.0))
        self._last_values: dict[str, Any] = dict(pos.get("last_values", {}))
        self._t0 = time.perf_counter()

    def finish(self, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Write ``summary.json``, close W&B and the logs; idempotent (later calls return the same summary).

        ``summary.json`` holds ``frames`` (last logged step), ``wall_s`` (cumulative, across resumes),
        ``eval/return_mean`` (last logged value, or ``null``) and everything in ``summary``, which wins.
        """
        if self._summary is not None:
            return self._summary
        out: dict[str, Any] = {
            "frames": self._step,
            "wall_s": self._time_offset + (time.perf_counter() - self._t0),
            "eval/return_mean": self._last_values.get("eval/return_mean"),
        }
        for key, value in (summary or {}).items():
            out[key] = value.item() if hasattr(value, "item") else value
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}
        write_json_atomic(self.dir / "summary.json", out)
        for sink in self.sinks:
            sink.set_summary(out)
        self._summary = out
        print(f"tdrl: run finished; summary in {self.dir / 'summary.json'}", flush=True)
        self.close()
        return out

    def close(self, exit_code: int = 0) -> None:
        """Close sinks, progress.csv and debug.log without writing a summary (a failed run); idempotent."""
        if self._closed:
            return
        self._closed = True
        self.progress.close()
        for sink in self.sinks:
            try:
                sink.close(exit_code=exit_code)
            except Exception as e:  # noqa: BLE001 - closing one mirror must not prevent closing the rest
                warnings.warn(f"closing {type(sink).__name__} failed: {e!r}", stacklevel=2)
        if self._debug_log is not None:
            self._debug_log.close()
        if self._lock is not None:
            self._lock.close()  # releases the flock

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()
        else:
            self.close(exit_code=1)
