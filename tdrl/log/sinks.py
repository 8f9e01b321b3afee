"""Metric sinks that mirror progress.csv rows: console (tqdm) and TensorBoard (W&B: :mod:`tdrl.log.wandb_sink`).

progress.csv (:class:`tdrl.log.progress.ProgressCSV`) is the source of truth and written first; a sink is a mirror
with the methods of :class:`Sink`, so a run writes each row to all of them and users can add their own.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Protocol

__all__ = ["ConsoleSink", "Sink", "TensorBoardSink", "make_tensorboard_sink"]

Row = Mapping[str, Any]


class Sink(Protocol):
    """What a run writes its log rows to."""

    def write(self, row: Row, step: int) -> None:
        """Record one row at ``step`` env frames."""

    def add_video(self, key: str, path: Path, step: int) -> None:
        """Attach an mp4 written at ``path``."""

    def set_summary(self, summary: Row) -> None:
        """Record the run's final numbers."""

    def close(self, exit_code: int = 0) -> None:
        """Flush and release resources (``exit_code=1``: the run failed); idempotent."""


def _number(row: Row, key: str) -> float:
    value = row.get(key)
    return math.nan if value is None else float(value)


class ConsoleSink:
    """A tqdm progress bar (frames, frames/s, last return) plus one summary line per log row.

    The bar uses ``disable=None``, so it switches itself off when ``bar_stream`` is not a terminal (SLURM logs),
    and it writes to the terminal's stderr, not the tee, so ``\\r`` updates never reach ``debug.log``. The
    summary line goes through ``print`` and is therefore in ``debug.log`` and batch logs.

    Args:
        name: shown at the start of each line.
        total_frames: the bar's total (``None``: a counter without ETA).
        initial: frames already done (a resumed run).
        progress_bar: ``False`` disables the bar; lines are still printed.
        bar_stream: where the bar is drawn (default ``sys.stderr``).
    """

    def __init__(
        self, *, name: str = "", total_frames: int | None = None, initial: int = 0, progress_bar: bool = True,
        bar_stream: IO[str] | None = None,
    ) -> None:
        from tqdm import tqdm

        self.name = name
        self._bar = tqdm(
            total=total_frames, initial=initial, unit="frame", unit_scale=True, dynamic_ncols=True,
            file=bar_stream if bar_stream is not None else sys.stderr, disable=None if progress_bar else True,
            desc=name or None,
        )

    def write(self, row: Row, step: int) -> None:
        """Advance the bar to ``step`` and print the row's headline numbers."""
        ret_key = "eval/return_mean" if row.get("eval/return_mean") is not None else "train/return_mean"
        ret = _number(row, ret_key)
        fps = _number(row, "StepsPerSecond")
        parts = [f"itr {row['Iteration']}" if row.get("Iteration") is not None else "", f"frames {step:,}"]
        if not math.isnan(fps):
            parts.append(f"{fps:,.0f} fps")
        for key in ("train/return_mean", "eval/return_mean"):
            if row.get(key) is not None:
                parts.append(f"{key} {float(row[key]):.4g}")
        if row.get("CumTime") is not None:
            parts.append(f"{float(row['CumTime']):.0f} s")
        line = (f"[{self.name}] " if self.name else "") + " | ".join(p for p in parts if p)
        bar = self._bar
        if not bar.disable:
            bar.clear()
        print(line, flush=True)
        if not bar.disable:
            postfix = {"fps": f"{fps:,.0f}"} if not math.isnan(fps) else {}
            if not math.isnan(ret):
                postfix["ret"] = f"{ret:.4g}"
            bar.set_postfix(postfix, refresh=False)
            bar.update(max(step - bar.n, 0))
            bar.refresh()

    def add_video(self, key: str, path: Path, step: int) -> None:
        """Print where the video went."""
        print(f"[{self.name}] video {key}: {path}", flush=True)

    def set_summary(self, summary: Row) -> None:
        """Nothing to show: the summary is printed by the run."""

    def close(self, exit_code: int = 0) -> None:
        """Close the bar."""
        self._bar.close()


class TensorBoardSink:
    """Scalars to TensorBoard event files (needs the ``tensorboard`` package; see :func:`make_tensorboard_sink`).

    Args:
        log_dir: directory for the event files, e.g. ``<run_dir>/tensorboard``.
    """

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard

        self._writer: Any = SummaryWriter(log_dir=str(log_dir))

    def write(self, row: Row, step: int) -> None:
        """One scalar per key with a value."""
        for key, value in row.items():
            if value is not None:
                self._writer.add_scalar(key, float(value), global_step=step)
        self._writer.flush()

    def add_video(self, key: str, path: Path, step: int) -> None:
        """Videos are not mirrored to TensorBoard (they are in the run directory and W&B)."""

    def set_summary(self, summary: Row) -> None:
        """TensorBoard has no run summary."""

    def close(self, exit_code: int = 0) -> None:
        """Flush and close the event file."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def make_tensorboard_sink(log_dir: Path) -> TensorBoardSink | None:
    """A :class:`TensorBoardSink`, or ``None`` with a warning when tensorboard is not installed."""
    try:
        return TensorBoardSink(log_dir)
    except ImportError as e:
        warnings.warn(
            f"logger.tensorboard=true but TensorBoard is unavailable ({e}); install `tensorboard` to enable it. "
            "Continuing without it.",
            stacklevel=2,
        )
        return None
