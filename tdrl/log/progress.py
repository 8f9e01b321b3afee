"""``progress.csv``: one row per log interval, readable without Python (rlpyt's tabular file).

The header is the keys in order of first appearance. A key first seen after rows were written (an eval metric
logged every few intervals, a loss that starts late) rewrites the file atomically with the widened header, so
earlier rows get an empty cell rather than the column being dropped (rlpyt, ray#13766) or misaligned.

Numbers are written exactly (ints as ints, floats with ``repr``), so a resumed run's file is byte-identical to an
uninterrupted one in every deterministic column; on resume :meth:`ProgressCSV.truncate` drops the rows written
after the checkpoint.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tdrl.utils.files import write_atomic

__all__ = ["ProgressCSV", "metric_value", "read_progress", "read_progress_floats"]


def metric_value(key: str, value: Any) -> float | int | None:
    """A metric as a python number (tensors and numpy scalars converted, bools as ints), or ``None``.

    Raises:
        TypeError: the value is not a real scalar (the message names the key).
    """
    if value is None:
        return None
    if hasattr(value, "item") and not isinstance(value, (int, float)):  # tensor or numpy scalar
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise TypeError(f"metric {key!r}: expected a scalar, got shape {tuple(value.shape)}") from None
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"metric {key!r}: expected a real number, got {type(value).__name__} {value!r}")
    return value


def _cell(key: str, value: Any) -> str:
    """CSV cell text: ints exactly, floats via ``repr`` (shortest round-trip), ``None`` as an empty cell."""
    value = metric_value(key, value)
    if value is None:
        return ""
    return str(value) if isinstance(value, int) else repr(float(value))


def read_progress(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows (cell text; empty means absent) of a progress.csv."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        # strict=False: a last line cut by a crash is short; its missing cells read as absent.
        rows = [dict(zip(header, cells, strict=False)) for cells in reader]
    return header, rows


def read_progress_floats(path: Path) -> dict[str, list[float]]:
    """Columns of a progress.csv as floats (``nan`` for an empty cell)."""
    header, rows = read_progress(path)
    return {k: [float(r[k]) if r.get(k, "") != "" else math.nan for r in rows] for k in header}


class ProgressCSV:
    """Appends rows to a progress.csv, widening the header when new keys appear; an existing file is continued."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.header: list[str] = []
        self.num_rows = 0
        if self.path.exists():
            self.header, rows = read_progress(self.path)
            self.num_rows = len(rows)
        self._file: io.TextIOWrapper | None = None

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row (keys are column names; values real numbers or ``None``)."""
        cells = {k: _cell(k, v) for k, v in row.items()}
        # Only keys with a value add columns: the header is exactly the columns that hold data, which is what
        # truncate() rebuilds, so a resumed file matches an uninterrupted one byte for byte.
        new_keys = [k for k in row if k not in self.header and cells[k] != ""]
        if new_keys or not self.path.exists():
            _, rows = read_progress(self.path) if self.path.exists() else ([], [])
            self.header = self.header + new_keys
            self._rewrite(rows + [cells])
        else:
            if self._file is None:
                self._file = open(self.path, "a", newline="")
            csv.writer(self._file, lineterminator="\n").writerow([cells.get(k, "") for k in self.header])
            self._file.flush()
        self.num_rows += 1

    def truncate(self, num_rows: int) -> None:
        """Keep the first ``num_rows`` rows; the header shrinks to the columns those rows use."""
        if not self.path.exists():
            self.header, self.num_rows = [], 0
            return
        _, rows = read_progress(self.path)
        if num_rows > len(rows):
            raise ValueError(f"{self.path} has {len(rows)} rows, cannot keep {num_rows}")
        rows = rows[:num_rows]
        self.header = [k for k in self.header if any(r.get(k, "") != "" for r in rows)]
        self._rewrite(rows)
        self.num_rows = num_rows

    def sync(self) -> None:
        """Force written rows to disk (called before a checkpoint records the row count)."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush, fsync and close the file."""
        if self._file is not None:
            self.sync()
            self._file.close()
            self._file = None

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows([r.get(k, "") for k in self.header] for r in rows)
        write_atomic(self.path, text.getvalue())
