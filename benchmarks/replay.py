"""Replay-buffer throughput: tdrl buffers next to TorchRL's ``ReplayBuffer(LazyMemmapStorage)``, in one run.

Data: HalfCheetah-sized transitions (observation 17 float32, action 6 float32, next observation, reward,
done/terminated/truncated), written as collector batches ``[B=8, T=128]`` (1,024 transitions per extend; TorchRL gets
the same batch flattened to ``[1024]``), sampled in batches of 256 transitions. Every buffer holds 1M transitions and
is filled completely before timing, so the numbers are steady-state ring behaviour with resident pages.

Rows (transitions per second, median of the repeats):

* ``extend``: transitions written per second.
* ``sample``: transitions sampled per second; for ``tdrl-prioritized`` each call also updates the batch's priorities
  (sample + update, what a PER learner does); for ``tdrl-sequence`` a call draws 8 sequences of 32 steps.

Targets (same run): tdrl-uniform extend >= 3x and sample >= 1.5x torchrl-uniform; tdrl-prioritized sample+update
>= 0.5x torchrl-uniform sample.

Usage: ``python benchmarks/replay.py [--quick] [--json PATH] [--capacity N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

B, T, BATCH = 8, 128, 256
SEQ_B, WARMUP_T, SEQ_T, INTERVAL = 8, 8, 24, 32


def make_batch(step: int, with_state: bool = False) -> TensorDict:
    g = torch.Generator().manual_seed(step)
    data = {
        "observation": torch.randn(B, T, 17, generator=g),
        "action": torch.randn(B, T, 6, generator=g),
        "next": {
            "observation": torch.randn(B, T, 17, generator=g),
            "reward": torch.randn(B, T, 1, generator=g),
            "done": torch.rand(B, T, 1, generator=g) < 0.001,
            "terminated": torch.zeros(B, T, 1, dtype=torch.bool),
            "truncated": torch.zeros(B, T, 1, dtype=torch.bool),
        },
    }
    if with_state:
        data["recurrent_state"] = {"h": torch.randn(B, T, 64, generator=g)}
    return TensorDict(data, batch_size=[B, T])


def rate(fn: Callable[[], int], seconds: float, repeats: int) -> float:
    """Median over ``repeats`` of items/s, each repeat running ``fn`` (returns items done) for ``seconds``."""
    fn()
    results = []
    for _ in range(repeats):
        items, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            items += fn()
        results.append(items / elapsed)
    return statistics.median(results)


def _parser() -> argparse.ArgumentParser:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--quick", action="store_true", help="short timings (< 1 minute in all)")
    parser.add_argument("--json", metavar="PATH", help="write rows {buffer, op, per_s} to PATH")
    parser.add_argument("--capacity", type=int, default=1_000_000)
    return parser


def _buffers(root: str, capacity: int) -> dict[str, Any]:
    """TorchRL's uniform buffer and tdrl's uniform, prioritized and sequence buffers, under ``root``."""
    from torchrl.data import LazyMemmapStorage, ReplayBuffer

    from tdrl.replay import PrioritizedSampler, SequenceReplayBuffer, TransitionReplayBuffer

    return {
        "torchrl-uniform": ReplayBuffer(storage=LazyMemmapStorage(capacity, scratch_dir=f"{root}/trl"),
                                        batch_size=BATCH),
        "tdrl-uniform": TransitionReplayBuffer(f"{root}/uni", capacity, seed=0),
        "tdrl-prioritized": TransitionReplayBuffer(f"{root}/per", capacity, seed=0,
                                                   sampler=PrioritizedSampler(alpha=0.6, beta_steps=10**6)),
        "tdrl-sequence": SequenceReplayBuffer(f"{root}/seq", capacity, batch_T=SEQ_T, warmup_T=WARMUP_T,
                                              rnn_state_interval=INTERVAL,
                                              state_keys=[("recurrent_state", "h")], seed=0),
    }


class _Ops:
    """The timed operations on each buffer: ``extend(name)`` and ``sample(name)`` give a call returning the
    transitions it handled."""

    def __init__(self, buffers: dict[str, Any]) -> None:
        self.buffers = buffers
        self.batches = [make_batch(i) for i in range(8)]
        self.flat = [b.reshape(-1) for b in self.batches]
        self.seq_batches = [make_batch(i, with_state=True) for i in range(8)]
        self.rng = np.random.default_rng(0)
        self.counter = iter(range(10**12))

    def extend(self, name: str) -> Callable[[], int]:
        rb = self.buffers[name]
        source = self.flat if name == "torchrl-uniform" else self.seq_batches if name == "tdrl-sequence" \
            else self.batches

        def run() -> int:
            rb.extend(source[next(self.counter) % len(source)])
            return B * T

        return run

    def sample(self, name: str) -> Callable[[], int]:
        rb = self.buffers[name]
        if name == "torchrl-uniform":
            return lambda: rb.sample().batch_size[0]
        if name == "tdrl-prioritized":
            def run() -> int:
                s = rb.sample(BATCH)
                rb.update_priority(s["index"], torch.from_numpy(self.rng.random(BATCH)))
                return BATCH
            return run
        if name == "tdrl-sequence":
            return lambda: rb.sample(SEQ_B).numel()
        return lambda: rb.sample(BATCH).batch_size[0]


def _measure(capacity: int, seconds: float, repeats: int) -> list[dict[str, Any]]:
    """Fill every buffer to ``capacity``, then time its extends and its samples."""
    root = tempfile.mkdtemp(prefix="tdrl-replay-bench-")
    fills = -(-capacity // (B * T))
    rows: list[dict[str, Any]] = []
    try:
        buffers = _buffers(root, capacity)
        ops = _Ops(buffers)
        for name in buffers:  # fill to capacity: steady-state ring writes and resident pages
            fill = ops.extend(name)
            t0 = time.perf_counter()
            for _ in range(fills):
                fill()
            print(f"filled {name} ({capacity:,} transitions) in {time.perf_counter() - t0:.1f}s", flush=True)
        for op, factory in (("extend", ops.extend), ("sample", ops.sample)):
            for name in buffers:
                rows.append({"buffer": name, "op": op, "per_s": rate(factory(name), seconds, repeats)})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _report(rows: list[dict[str, Any]], capacity: int) -> None:
    """The table against TorchRL's buffer, then the targets met or missed."""
    base = {r["op"]: r["per_s"] for r in rows if r["buffer"] == "torchrl-uniform"}
    print(f"\nreplay throughput, transitions/s (capacity {capacity:,}, extend [{B},{T}], sample {BATCH}; "
          f"load {os.getloadavg()[0]:.1f})")
    print(f"{'buffer':<18} {'op':<8} {'per_s':>14} {'x torchrl':>10}")
    for r in rows:
        print(f"{r['buffer']:<18} {r['op']:<8} {r['per_s']:>14,.0f} {r['per_s'] / base[r['op']]:>9.2f}x")
    get = {(r["buffer"], r["op"]): r["per_s"] for r in rows}
    checks = [
        ("tdrl-uniform extend >= 3x torchrl", get["tdrl-uniform", "extend"] / base["extend"], 3.0),
        ("tdrl-uniform sample >= 1.5x torchrl", get["tdrl-uniform", "sample"] / base["sample"], 1.5),
        ("tdrl-prioritized sample+update >= 0.5x torchrl sample",
         get["tdrl-prioritized", "sample"] / base["sample"], 0.5),
    ]
    print()
    for label, ratio, target in checks:
        print(f"{'PASS' if ratio >= target else 'MISS'}  {label}: {ratio:.2f}x")


def main() -> None:
    args = _parser().parse_args()
    seconds, repeats = (0.4, 3) if args.quick else (2.0, 5)
    torch.set_num_threads(1)
    rows = _measure(args.capacity, seconds, repeats)
    _report(rows, args.capacity)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Replay"):  # --markdown PAGE#SECTION: into its docs section
        main()
