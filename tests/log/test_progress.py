"""progress.csv: rlpyt columns, statistics against a hand computation, widening header, truncation."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from tdrl.config import CheckpointConfig, LoggerConfig, RunConfig
from tdrl.log import (
    RESERVED_COLUMNS,
    ProgressCSV,
    Run,
    read_progress,
    summarize,
    summarize_columns,
    summarize_records,
)
from tdrl.train import Bookkeeper, Schedule


def _open(tmp_path, **logger):
    cfg = {"run": {"dir": str(tmp_path / "run")}}
    return Run.open(
        config=cfg,
        run=RunConfig(dir=str(tmp_path / "run")),
        logger=LoggerConfig(wandb=False, progress_bar=False, **logger),
        checkpoint=CheckpointConfig(),
        name="t",
    )


def test_summary_statistics_match_hand_computation():
    returns = [1.0, 2.0, 6.0, 3.0]
    got = summarize_records([{"return": r, "length": 10 * r} for r in returns], prefix="train/")
    assert list(got)[:5] == [f"train/return_{s}" for s in ("mean", "std", "median", "min", "max")]
    assert got["train/return_mean"] == 3.0
    # population std, as rlpyt's np.std
    assert got["train/return_std"] == pytest.approx(math.sqrt((4 + 1 + 9 + 0) / 4))
    assert got["train/return_median"] == 2.5
    assert (got["train/return_min"], got["train/return_max"]) == (1.0, 6.0)
    assert got["train/length_mean"] == 30.0
    losses = summarize_columns({"loss/q": torch.tensor([0.5, 1.5, 4.0])})
    assert losses == {
        "loss/q_mean": 2.0,
        "loss/q_std": pytest.approx(float(np.std([0.5, 1.5, 4.0]))),
        "loss/q_median": 1.5,
        "loss/q_min": 0.5,
        "loss/q_max": 4.0,
    }


def test_empty_interval_gives_nan_columns_when_fields_named():
    assert summarize_records([], prefix="eval/") == {}
    got = summarize_records([], prefix="eval/", fields=["return"])
    assert len(got) == 5 and all(math.isnan(v) for v in got.values())
    with pytest.raises(TypeError, match="statistic 'x'"):
        summarize("x", ["a"])


def test_bookkeeper_rows_have_rlpyt_columns_and_hand_computed_values(tmp_path):
    run = _open(tmp_path)
    book = Bookkeeper(run=run, schedule=Schedule(1000, 100), frames_per_itr=100, update_batch_size=10)
    book.start_session()
    with book.paused(evaluating=True):
        time.sleep(0.2)  # evaluation: in CumTime, not in the rates (rlpyt's)
    book.frames, book.itr = 100, 0
    book.add_episodes([{"return": 10.0, "length": 10}, {"return": 30.0, "length": 30}])
    book.record(updates=20)
    first = book.log()
    book.frames, book.itr = 300, 1
    book.traj_window.clear()
    book.add_episodes([{"return": 50.0, "length": 50}])
    book.record(updates=30)
    book.log({"loss/q": torch.tensor(0.25)})
    run.finish()
    assert first["StepsPerSecond"] > 100 / 0.2 and first["CumTime"] >= 0.2
    header, rows = read_progress(tmp_path / "run" / "progress.csv")
    assert header[:10] == list(RESERVED_COLUMNS)
    first, second = rows
    assert (first["Iteration"], first["CumSteps"], first["CumUpdates"]) == ("0", "100", "20")
    assert float(first["ReplayRatio"]) == 20 * 10 / 100  # samples trained on per new frame
    assert float(second["ReplayRatio"]) == 30 * 10 / 200
    assert float(second["CumReplayRatio"]) == 50 * 10 / 300
    assert (first["CumCompletedTrajs"], second["CumCompletedTrajs"]) == ("2", "3")
    assert float(first["train/return_mean"]) == 20.0 and float(first["train/return_std"]) == 10.0
    assert float(first["train/return_median"]) == 20.0
    assert (float(first["train/return_min"]), float(first["train/return_max"])) == (10.0, 30.0)
    assert float(second["train/return_mean"]) == 50.0 and float(second["train/return_std"]) == 0.0
    # a key first seen in a later row widens the header; the earlier row gets an empty cell
    assert first["loss/q"] == "" and second["loss/q"] == "0.25"
    assert float(second["CumTime"]) >= float(first["CumTime"]) > 0


def test_widening_header_rewrites_and_missing_keys_are_empty(tmp_path):
    csv = ProgressCSV(tmp_path / "progress.csv")
    csv.write({"a": 1, "b": 0.1})
    csv.write({"a": 2, "c": 3.5})  # new key c, missing b
    csv.write({"a": 3, "b": 0.30000000000000004})
    csv.close()
    text = (tmp_path / "progress.csv").read_text()
    assert text == "a,b,c\n1,0.1,\n2,,3.5\n3,0.30000000000000004,\n"  # floats round-trip exactly
    reopened = ProgressCSV(tmp_path / "progress.csv")
    assert reopened.num_rows == 3 and reopened.header == ["a", "b", "c"]
    reopened.truncate(1)  # resume from a checkpoint taken after row 1: c was never logged by then
    assert (tmp_path / "progress.csv").read_text() == "a,b\n1,0.1\n"
    assert not list(tmp_path.glob(".*.tmp"))


def test_bad_metrics_are_errors_naming_the_key(tmp_path):
    run = _open(tmp_path)
    with pytest.raises(TypeError, match="'train/name'"):
        run.log({"train/name": "abc"}, step=1)
    with pytest.raises(TypeError, match="'loss/v'.*scalar"):
        run.log({"loss/v": torch.ones(3)}, step=1)
    with pytest.raises(ValueError, match="'CumSteps'"):
        run.log({"CumSteps": 3}, step=1)
    run.log({"ok": np.float32(0.5), "flag": True, "none": None}, step=2)
    run.finish()
    header, rows = read_progress(tmp_path / "run" / "progress.csv")
    assert rows == [{**rows[0], "ok": "0.5", "flag": "1"}] and "none" not in header
