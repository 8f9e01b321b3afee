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


class ConsoleSink:
    """A tqdm progress bar (frames, frames/s, last return) plus one summary line per log row.

    The bar uses ``disable=None``, so it switches itself off when ``bar_stream`` is not a terminal (SLURM logs),
    and it writes to the terminal's stderr, not the tee, so ``\\r`` updates never reach ``debug.log``. The
    summary line goes through ``print`` and is therefore in ``debug.log`` and batch logs.

    ``name`` starts each line; ``total_frames`` is the bar's total (``None``: a counter without ETA);
    ``progress_bar=False`` disables the bar (lines are still printed); ``bar_stream`` defaults to ``sys.stderr``.
    """

    def __init__(self, *, name: str = "", total_frames: int | None = None, progress_bar: bool = True,
                 bar_stream: IO[str] | None = None) -> None:
        from tqdm import tqdm

        self.name = name
        self._bar = tqdm(total=total_frames, unit="frame", unit_scale=True, dynamic_ncols=True,
                         file=bar_stream if bar_stream is not None else sys.stderr,
                         disable=None if progress_bar else True, desc=name or None)

    def write(self, row: Row, step: int) -> None:
        """Advance the bar to ``step`` and print the row's headline numbers."""
        fps = float(row["StepsPerSecond"]) if row.get("StepsPerSecond") is not None else math.nan
        parts = [f"itr {row['Iteration']}"] if row.get("Iteration") is not None else []
        parts.append(f"frames {step:,}")
        if not math.isnan(fps):
            parts.append(f"{fps:,.0f} fps")
        returns = {k: float(row[k]) for k in ("train/return_mean", "eval/return_mean") if row.get(k) is not None}
        parts += [f"{key} {value:.4g}" for key, value in returns.items()]
        if row.get("CumTime") is not None:
            parts.append(f"{float(row['CumTime']):.0f} s")
        bar = self._bar
        if not bar.disable:
            bar.clear()
        print((f"[{self.name}] " if self.name else "") + " | ".join(parts), flush=True)
        if not bar.disable:
            ret = returns.get("eval/return_mean", returns.get("train/return_mean", math.nan))
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
    """Scalars to TensorBoard event files in ``log_dir`` (needs the ``tensorboard`` package)."""

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
        warnings.warn(f"logger.tensorboard=true but TensorBoard is unavailable ({e}); install `tensorboard` to "
                      "enable it. Continuing without it.", stacklevel=2)
        return None
