"""Optimiser metrics are read back once per key at a log row, never per update (on a GPU each read is a sync)."""

from __future__ import annotations

import pytest
import torch
from host_reads import forbid_host_reads
from tensordict import TensorDict

from tdrl.train.bookkeeping import Bookkeeper
from tdrl.train.schedule import Schedule
from tdrl.utils.stats import metrics_to_floats, summarize_metrics


def _metrics(n: int) -> list:
    return [TensorDict({"loss_q": torch.tensor(float(i)), "grad_norm": torch.tensor(2.0 * i), "lr": 1e-3,
                        "td_error": torch.ones(4)}, []) for i in range(n)]


def test_recording_reads_nothing_and_a_log_row_reads_each_key_once(monkeypatch):
    book = Bookkeeper(schedule=Schedule(80, 8), frames_per_itr=8)
    with forbid_host_reads("Bookkeeper.record"):
        for metrics in _metrics(50):
            book.record(metrics, updates=1)
    reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t.shape) or real_tolist(t))
    monkeypatch.setattr(torch.Tensor, "item", lambda t: pytest.fail("a per-update .item() read"))
    row = book.log()
    assert reads == [torch.Size([50])] * 3  # loss_q, grad_norm, lr (td_error is not a scalar: not logged)
    assert row["loss/q_mean"] == pytest.approx(24.5) and row["train/grad_norm_max"] == 98.0
    assert row["train/lr_mean"] == pytest.approx(1e-3) and "train/td_error_mean" not in row


def test_metrics_to_floats_keeps_rows_and_keys():
    rows = metrics_to_floats([{"loss_a": torch.tensor(1.0)}, {"loss_b": torch.tensor(2.0), "x": 3}, {}])
    assert rows == [{"loss/a": 1.0}, {"loss/b": 2.0, "train/x": 3.0}, {}]
    assert summarize_metrics([{"loss_a": torch.tensor(1.0)}, {"loss_a": 3.0}])["loss/a_mean"] == 2.0
