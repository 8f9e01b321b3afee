"""tdrl.log: run directories, progress.csv, metric sinks (console, W&B, TensorBoard), videos.

Start here: :class:`Run` (``Run.open(...)``) owns a run directory, its logs and checkpoints, and exact resume;
:func:`summarize_records` / :func:`summarize_columns` (from :mod:`tdrl.utils.stats`) turn per-episode and
per-update values into rlpyt's Average/Std/Median/Min/Max columns. wandb and tensorboard load only when enabled.
"""

from tdrl.log.progress import ProgressCSV, read_progress, read_progress_floats
from tdrl.log.run import RESERVED_COLUMNS, WALL_TIME_COLUMNS, Run, is_wall_time_column
from tdrl.log.rundir import RunDirError
from tdrl.log.sinks import ConsoleSink, Sink, TensorBoardSink
from tdrl.log.video import VideoError, write_video
from tdrl.utils.stats import STATISTICS, summarize, summarize_columns, summarize_records

__all__ = ["RESERVED_COLUMNS", "STATISTICS", "WALL_TIME_COLUMNS", "ConsoleSink", "ProgressCSV", "Run", "RunDirError",
           "Sink", "TensorBoardSink", "VideoError", "is_wall_time_column", "read_progress", "read_progress_floats",
           "summarize", "summarize_columns", "summarize_records", "write_video"]
