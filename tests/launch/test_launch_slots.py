"""Hardware slots: how many runs at once, which cores and GPUs each gets, impossible requests."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tdrl.launch import Slot, SlotError, make_slots
from tdrl.launch.slots import current_slot_cpus, format_cpus, parse_cpus


def test_cpu_only_slots_split_the_cores():
    slots = make_slots(cpus_per_run=2, cpus=range(8))
    assert [s.cpus for s in slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(s.gpus == () for s in slots)
    assert len(make_slots(cpus_per_run=3, cpus=range(8))) == 2  # leftover cores stay idle
    assert len(make_slots(cpus=range(8), max_slots=3)) == 3


def test_gpu_slots_follow_rlpyt_even_split():
    # rlpyt's example: 8 GPUs, 40 cores, 1 GPU per run -> 8 runs with 5 cores each
    slots = make_slots(gpus_per_run=1, cpus=range(40), n_gpus=8)
    assert len(slots) == 8 and all(len(s.cpus) == 5 for s in slots)
    assert [s.gpus for s in slots] == [(g,) for g in range(8)]
    two = make_slots(gpus_per_run=2, cpus=range(40), n_gpus=8)
    assert [s.gpus for s in two] == [(0, 1), (2, 3), (4, 5), (6, 7)] and len(two[0].cpus) == 10
    shared = make_slots(gpus_per_run=1, runs_per_gpu=2, cpus=range(8), n_gpus=2)
    assert [s.gpus for s in shared] == [(0,), (0,), (1,), (1,)] and all(
        len(s.cpus) == 2 for s in shared
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(cpus_per_run=3, cpus=(0, 1)),
            r"cpus_per_run=3 but this machine has 2 CPU cores \(0-1\)",
        ),
        (dict(gpus_per_run=1, n_gpus=0, cpus=(0, 1)), "gpus_per_run=1 but this machine has 0 GPUs"),
        (dict(gpus_per_run=2, runs_per_gpu=2, n_gpus=4, cpus=(0, 1)), "gpus_per_run must be 1"),
        (
            dict(gpus_per_run=1, runs_per_gpu=4, n_gpus=1, cpus=(0, 1), cpus_per_run=None),
            "at least one core each",
        ),
        (dict(cpus_per_run=0, cpus=(0, 1)), "at least 1 core"),
    ],
)
def test_impossible_requests_fail_with_the_reason(kwargs, message):
    with pytest.raises(SlotError, match=message):
        make_slots(**kwargs)


def test_impossible_request_against_this_machine():
    n = len(os.sched_getaffinity(0))
    with pytest.raises(SlotError, match=f"cpus_per_run={n + 1} but this machine has {n} CPU cores"):
        make_slots(cpus_per_run=n + 1)


def test_slot_env_and_pinning_reach_a_child_process():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    slot = Slot(index=3, cpus=(cpu,))
    env = slot.env()
    assert (
        env["OMP_NUM_THREADS"] == "1"
        and env["CUDA_VISIBLE_DEVICES"] == ""
        and env["TDRL_SLOT"] == "3"
    )
    code = (
        "import os, torch; from tdrl.launch.slots import current_slot_cpus;"
        "print(sorted(os.sched_getaffinity(0)), torch.get_num_threads(), current_slot_cpus())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        preexec_fn=slot.pin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == f"[{cpu}] 1 ({cpu},)"
    gpu = Slot(0, (0, 1), (2, 3)).env()
    assert (
        gpu["CUDA_VISIBLE_DEVICES"] == "2,3"
        and gpu["EGL_DEVICE_ID"] == "2"
        and gpu["OMP_NUM_THREADS"] == "2"
    )


def test_cpu_list_round_trip(monkeypatch):
    assert parse_cpus("0-2,5, 7-8") == (0, 1, 2, 5, 7, 8)
    assert format_cpus((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    with pytest.raises(SlotError, match="cannot read CPU list"):
        parse_cpus("zero")
    monkeypatch.setenv("TDRL_SLOT_CPUS", "4-5")
    assert current_slot_cpus() == (4, 5)
    monkeypatch.delenv("TDRL_SLOT_CPUS")
    assert current_slot_cpus() == tuple(sorted(os.sched_getaffinity(0)))
