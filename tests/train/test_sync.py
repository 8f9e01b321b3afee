"""rlpyt runner semantics of SyncTrainer: iteration counts, log/eval cadence, replay ratio, min_steps_learn,
eval time excluded from train time, checkpoint/resume at iteration boundaries, collector shutdown."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from tensordict import TensorDict

from tdrl.log import is_wall_time_column
from tdrl.train import Schedule, SyncTrainer, iteration_counts, updates_per_iteration


class ScriptedCollector:
    """A [B, T] collector double: counts batches, weight syncs and shutdowns; one episode ends per batch."""

    def __init__(self, batch_B: int = 2, batch_T: int = 5, collect_s: float = 0.0) -> None:
        self.batch_B, self.batch_T = batch_B, batch_T
        self.frames_per_batch = batch_B * batch_T
        self.batches = 0
        self.weight_syncs = 0
        self.shutdowns = 0
        self.collect_s = collect_s
        self.traj_infos: list[dict] = []

    def __iter__(self):
        while True:
            if self.collect_s:
                time.sleep(self.collect_s)
            self.batches += 1
            self.traj_infos = [{"Return": float(self.batches), "Length": 10}]
            yield TensorDict({"observation": torch.full((self.batch_B, self.batch_T, 1), float(self.batches))},
                             [self.batch_B, self.batch_T])

    def update_policy_weights_(self):
        self.weight_syncs += 1

    def shutdown(self):
        self.shutdowns += 1

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state):
        self.batches = state["batches"]


class ScriptedEval:
    def __init__(self, eval_s: float = 0.0):
        self.calls = 0
        self.eval_s = eval_s
        self.shutdowns = 0

    def evaluate(self):
        self.calls += 1
        if self.eval_s:
            time.sleep(self.eval_s)
        return [{"Return": 100.0 * self.calls, "Length": 5}, {"Return": 100.0 * self.calls + 2, "Length": 7}]

    def shutdown(self):
        self.shutdowns += 1

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.calls = state["calls"]


class MemoryRun:
    """Run double: keeps logged rows, checkpoints in memory, and the finished summary."""

    def __init__(self):
        self.rows, self.checkpoints, self.summary = [], [], None

    def log(self, row, *, step, iteration=None):
        self.rows.append((step, {"Iteration": iteration, **row}))

    def will_checkpoint(self, iteration):
        return True

    def save_checkpoint(self, state, iteration, *, step=None, extra_writers=None):
        self.checkpoints.append((iteration, copy.deepcopy(state)))  # a real Run serialises

    def load_checkpoint(self, *, extra_readers=None):
        return self.checkpoints[-1][1] if self.checkpoints else None

    def close(self, exit_code=0):
        self.closed = exit_code

    def finish(self, summary):
        self.summary = summary


def test_iteration_counts_round_up_to_log_interval():
    # rlpyt get_n_itr: 1000 steps of 10-frame batches = 100 itr; log every 30 steps = 3 itr -> 102 itr
    assert iteration_counts(1000, 30, 10) == (102, 3)
    assert iteration_counts(1000, 5, 10) == (100, 1)  # log interval shorter than a batch -> every iteration
    assert iteration_counts(100, 100, 10) == (10, 10)
    # a log interval longer than the run logs once, at its end; the run is not stretched to the interval
    assert iteration_counts(3000, 100_000_000, 8) == (375, 375)
    # at least n_steps (rlpyt rounds down first: 1000 frames of 256-frame iterations logged every 1000 ran 768)
    assert iteration_counts(1000, 1000, 256) == (6, 3)


@pytest.mark.parametrize("frames_per_itr", [1, 7, 40, 256])
def test_iteration_counts_train_at_least_n_steps_and_end_on_a_log_row(frames_per_itr):
    for n_steps in [1, 99, 100, 255, 256, 257, 1000, 4097]:
        for log_interval_steps in [1, 50, 256, 1000, 10_000]:
            n_itr, log_itrs = iteration_counts(n_steps, log_interval_steps, frames_per_itr)
            # log at least as often as asked, and at least once: at the end of a run shorter than the interval
            assert log_itrs == min(max(log_interval_steps // frames_per_itr, 1), -(-n_steps // frames_per_itr))
            assert n_itr % log_itrs == 0 and n_itr * frames_per_itr >= n_steps
            assert (n_itr - log_itrs) * frames_per_itr < n_steps  # no log interval more than needed


def test_updates_per_iteration_from_replay_ratio():
    # rlpyt: updates_per_itr = replay_ratio * frames_per_itr / batch_size, at least 1
    assert updates_per_iteration(8, 4 * 1, 32) == 1
    assert updates_per_iteration(8, 64, 32) == 16
    assert updates_per_iteration(1, 256, 128) == 2
    assert updates_per_iteration(0.1, 10, 256) == 1


def test_loop_counts_frames_iterations_and_weight_syncs():
    collector = ScriptedCollector()
    trainer = SyncTrainer(collector=collector, schedule=Schedule(n_steps=100, log_interval_steps=30))
    seen = []
    for batch in trainer:
        seen.append(trainer.itr)
        assert batch.batch_size == torch.Size([2, 5])
        trainer.record({"loss_x": torch.tensor(1.0)}, updates=2)
    assert trainer.n_itr == 12 and seen == list(range(12))  # 10 itr rounded up to a multiple of 3
    assert trainer.frames == 120 and trainer.updates == 24 and trainer.itr == 12
    assert collector.weight_syncs == 12  # before every batch
    assert collector.shutdowns == 1
    assert [row["Iteration"] for row in trainer.history] == [3, 6, 9, 12]
    assert trainer.history[0]["loss/x_mean"] == 1.0 and trainer.history[0]["loss/x_std"] == 0.0
    assert trainer.history[-1]["train/return_mean"] == pytest.approx(sum(range(1, 13)) / 12)


def test_loop_trains_at_least_n_steps_frames():
    # 10-frame batches
    trainer = SyncTrainer(collector=ScriptedCollector(), schedule=Schedule(n_steps=25, log_interval_steps=25))
    for _ in trainer:
        pass
    # 25 frames = 2.5 iterations -> 3, then on to the next log row (every 2 iterations): 4; rlpyt's floor gave 20
    assert trainer.frames == 40 and [row["Iteration"] for row in trainer.history] == [2, 4]


def test_online_statistics_use_last_log_traj_window_episodes():
    trainer = SyncTrainer(collector=ScriptedCollector(), log_traj_window=4,
                          schedule=Schedule(n_steps=100, log_interval_steps=100))
    for _ in trainer:
        pass
    last = trainer.history[-1]
    assert last["train/return_mean"] == pytest.approx((7 + 8 + 9 + 10) / 4)
    assert last["train/return_min"] == 7 and last["train/return_max"] == 10
    assert last["NewCompletedTrajs"] == 10


def test_eval_at_iteration_zero_and_every_log_interval_excluded_from_train_time():
    evaluator = ScriptedEval(eval_s=0.05)
    trainer = SyncTrainer(collector=ScriptedCollector(collect_s=0.002), eval_collector=evaluator,
                          schedule=Schedule(n_steps=60, log_interval_steps=20))
    for _ in trainer:
        pass
    # 6 iterations, log every 2: eval before training (itr 0) and after itr 2, 4, 6
    assert evaluator.calls == 4
    assert [row["Iteration"] for row in trainer.history] == [0, 2, 4, 6]
    assert [row["CumSteps"] for row in trainer.history] == [0, 20, 40, 60]
    assert [row["eval/return_mean"] for row in trainer.history] == [101, 201, 301, 401]
    summary = trainer.summary
    assert summary["eval/return_mean"] == 401
    # 4 evaluations of 50 ms are in wall time but not in train time (6 batches of 2 ms are)
    assert summary["wall_s"] - summary["train_s"] >= 0.2
    assert summary["train_s"] < 0.15
    assert evaluator.shutdowns == 1


def test_no_update_before_min_steps_learn():
    trainer = SyncTrainer(collector=ScriptedCollector(),
                          schedule=Schedule(n_steps=100, log_interval_steps=100, replay_ratio=8, batch_size=20,
                                            min_steps_learn=35))
    due = []
    for _ in trainer:
        due.append(trainer.updates_due)
        trainer.record(updates=trainer.updates_due)
    # min_itr_learn = 35 // 10 = 3: itr 0,1,2 (30 frames collected) do not update; 8*10/20 = 4 updates after
    assert due == [0, 0, 0] + [4] * 7
    assert trainer.updates == 28
    assert trainer.history[-1]["CumReplayRatio"] == pytest.approx(28 * 20 / 100)


def test_replay_ratio_needs_batch_size():
    with pytest.raises(ValueError, match="replay_ratio and batch_size"):
        SyncTrainer(collector=ScriptedCollector(),
                    schedule=Schedule(n_steps=10, log_interval_steps=10, replay_ratio=4))


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))


def test_checkpoint_at_log_boundaries_and_resume_continues():
    run = MemoryRun()
    model = Counter()
    trainer = SyncTrainer(collector=ScriptedCollector(), run=run, checkpoint_state={"model": model},
                          schedule=Schedule(n_steps=100, log_interval_steps=20))
    for _ in trainer:
        with torch.no_grad():
            model.w += 1
        if trainer.itr == 6:
            break  # killed mid-iteration 6: the last checkpoint is after iteration 6 (itr counter 6)
    assert [itr for itr, _ in run.checkpoints] == [2, 4, 6]
    assert run.summary is None and run.closed == 1  # an interrupted run does not finish
    # relaunch: new objects, same run
    model2 = Counter()
    collector2 = ScriptedCollector()
    trainer2 = SyncTrainer(collector=collector2, run=run, checkpoint_state={"model": model2},
                           schedule=Schedule(n_steps=100, log_interval_steps=20))
    seen = []
    for _ in trainer2:
        seen.append(trainer2.itr)
        with torch.no_grad():
            model2.w += 1
    assert trainer2.resumed and seen == [6, 7, 8, 9]
    assert model2.w.item() == 10  # 6 restored + 4 more
    assert trainer2.frames == 100 and collector2.batches == 6 + 4
    assert run.summary["frames"] == 100
    assert [row["Iteration"] for _, row in run.rows] == [2, 4, 6, 8, 10]


def test_stop_return_ends_early():
    trainer = SyncTrainer(collector=ScriptedCollector(), eval_collector=ScriptedEval(),
                          schedule=Schedule(n_steps=1000, log_interval_steps=10, stop_return=250))
    for _ in trainer:
        pass
    assert trainer.stopped_early and trainer.itr == 2  # evals: 101 (itr 0), 201, 301 -> stop


def test_resume_between_log_rows_keeps_the_open_interval_and_the_evaluator():
    def train(run, stop_at=None):
        trainer = SyncTrainer(collector=ScriptedCollector(), run=run, eval_collector=ScriptedEval(),
                              schedule=Schedule(n_steps=60, log_interval_steps=30, checkpoint_interval_steps=20))
        for _ in trainer:
            trainer.record({"loss_x": torch.tensor(float(trainer.itr))}, updates=1)
            if trainer.itr == stop_at:
                break  # killed in iteration 3: the last checkpoint (after 2 iterations) is inside the row at 3

    def rows(run):
        return [(step, {k: v for k, v in row.items() if not is_wall_time_column(k)}) for step, row in run.rows]

    reference, resumed = MemoryRun(), MemoryRun()
    train(reference)
    train(resumed, stop_at=3)
    assert [itr for itr, _ in resumed.checkpoints] == [2]
    train(resumed)
    # the row at 3 again, then 6: the same loss statistics (updates 0-2), episodes and evaluations (201, 301)
    assert rows(resumed)[-2:] == rows(reference)[-2:]
    assert rows(reference)[-2][1]["loss/x_mean"] == 1.0 and rows(reference)[-1][1]["eval/return_mean"] == 301


def test_rows_split_training_time_into_the_loops_phases():
    """time/<phase>_s: cumulative wall seconds of collect, extend (none without a replay), the loop body (learn),
    rows and checkpoints; together within time/train_s, and carried through a checkpoint."""
    run = MemoryRun()
    trainer = SyncTrainer(collector=ScriptedCollector(collect_s=0.01), run=run,
                          schedule=Schedule(n_steps=60, log_interval_steps=20))
    for _ in trainer:
        time.sleep(0.02)
    rows = [row for _, row in run.rows]
    assert [row["Iteration"] for row in rows] == [2, 4, 6]
    for phases, n_itr in ((rows[0], 2), (rows[-1], 6)):
        assert 0.01 * n_itr <= phases["time/collect_s"] < 0.01 * n_itr + 0.05
        assert 0.02 * n_itr <= phases["time/learn_s"] < 0.02 * n_itr + 0.05
        assert "time/extend_s" not in phases
        spent = sum(v for k, v in phases.items() if k.startswith("time/") and k not in ("time/train_s", "time/eval_s"))
        assert spent <= phases["time/train_s"]
    assert rows[-1]["time/checkpoint_s"] > 0 and rows[-1]["time/log_s"] > 0  # after the first row and checkpoint
    assert run.checkpoints[-1][1]["trainer"]["phase_s"]["learn"] >= 0.12


def test_a_snapshot_mode_that_keeps_nothing_gathers_no_checkpoint_state():
    class NoSnapshots(MemoryRun):
        def will_checkpoint(self, iteration):
            return False

    run = NoSnapshots()
    collector = ScriptedCollector()
    collector.state_dict = lambda: pytest.fail("a checkpoint's state was gathered")
    trainer = SyncTrainer(collector=collector, run=run, schedule=Schedule(n_steps=40, log_interval_steps=20))
    for _ in trainer:
        pass
    assert run.checkpoints == [] and all("time/checkpoint_s" not in row for _, row in run.rows)
