"""Collector throughput on CartPole-v1 and HalfCheetah-v5, every row measured in the same run.

Rows (``--json`` names):

* ``raw-vector-mlp`` — **c**: gymnasium ``SyncVectorEnv(B)`` + the 2×64 tanh MLP, one batched forward per step.
* ``raw-vector-mlp-2proc`` — c's loop split over 2 processes (``B/2`` envs each, no data kept): what the two cores
  give c's own loop in this run (shared machines do not always give a run two full cores), the yardstick for the
  2-process rows.
* ``torchrl-best`` — the best of TorchRL's ``Collector(SerialEnv(8))``, ``MultiSyncCollector(2×SerialEnv(4))``
  and ``MultiSyncCollector(2×SerialEnv(16))`` (each also printed).
* ``envpool`` — envpool's own C++ thread pool (``num_threads=2``, ``B`` envs) + the same MLP, one batched forward
  per step (skipped, with the reason printed, when envpool cannot be imported: ``pip install 'tdrl[bench]'``).
* ``sb3-rollout`` — Stable-Baselines3 PPO ``collect_rollouts`` on ``DummyVecEnv(B)`` (value head, sampling).
* ``tdrl-serial``, ``tdrl-parallel``, ``tdrl-action-server``, ``tdrl-alternating`` — tdrl's collectors with a tdrl
  model of the same 2×64 tanh MLP (:class:`tdrl.models.MLP` in an ``ObservationModule``, called through the acting
  contract), ``B = 2 workers × 16 envs``, ``T = 128``; ``--compile`` runs its ``act`` through ``torch.compile``.
* ``user-tdm-serial``, ``user-tdm-parallel`` — the same network as a TorchRL user builds it:
  ``TensorDictModule(Sequential(torchrl.modules.MLP(num_cells=[64, 64], activation_class=Tanh), head),
  in_keys=["observation"], out_keys=["action"])`` with the deterministic head above (argmax / tanh), holding the
  ``tdrl-*`` rows' weights (the same actions, so the same env dynamics: MuJoCo's step time depends on contacts).
* Observation normalization, with the ``tdrl-serial``/``tdrl-parallel`` model: ``tdrl-{serial,parallel}-vecnorm``
  (TorchRL's ``VecNorm(in_keys=["observation"])`` as the collector's ``transform=``, batched per step) against
  ``tdrl-{serial,parallel}-gym-normobs`` (``gymnasium.wrappers.NormalizeObservation`` around each env).
* PPO section: ``tdrl-serial-ppo``/``tdrl-parallel-ppo``/``tdrl-action-server-ppo`` run tdrl's PPO actor-critic
  (``make_actor_critic``: sampling, log-prob and the value head, 2×64 tanh MLPs) against ``sb3-rollout``.
* ``tdrl-parallel-startup`` — seconds to build a 2-worker, 32-env HalfCheetah collector in a fresh process
  (cold: first collector of the process; warm: the next one).
* Atari section (``ALE/Pong-v5``: 84x84x4 uint8, frame skip 4, sticky actions 0.25; skipped without ale-py, or with
  ``--skip atari``): ``B = 2 workers x 4 envs``, a random policy and the Nature-DQN CNN (``make_q_actor``, greedy):
  ``envpool-atari-*`` (envpool's ``Pong-v5`` with the same settings, 2 threads), ``gym-async-atari-*`` (gymnasium's
  ``AsyncVectorEnv``, one process per env, ``tdrl.envs`` preprocessing), ``tdrl-parallel-atari-*`` and
  ``tdrl-action-server-atari-cnn``. Then the replay memory of 1M Atari transitions, measured on small buffers and
  scaled: stacked observations (``TransitionReplayBuffer``), frame de-duplication (``FrameStack``) and R2D1's
  ``SequenceReplayBuffer`` (stacks, plus a 512-wide LSTM state every 32 steps). ``--skip atari-random``,
  ``atari-cnn`` or ``atari-replay-memory`` leave those parts out; ``--envs`` with no id, the sections above.

Besides wall-clock frames/s, every row reports frames per CPU-second of all its processes (main + workers):
a load-independent efficiency figure for shared machines (a 2-worker collector on 2 idle cores delivers about
twice its frames per CPU-second).

Each row: one warm-up batch, then ``--repeats`` timed runs of at least ``--seconds`` each, taken round-robin
over all rows of an env (so load changes during the run hit every row alike); the median is reported. Torch runs
with one thread. Run from a temporary directory: ``cd $(mktemp -d) && python /path/to/benchmarks/collectors.py``.

Usage::

    python benchmarks/collectors.py [--quick] [--json PATH] [--envs CartPole-v1 HalfCheetah-v5] [--quiet 0.1]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("MUJOCO_GL", "egl")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

B, T, WORKERS = 32, 128, 2


# ----------------------------------------------------------------------------- policies
class PolicyMLP(torch.nn.Module):
    """2×64 tanh MLP with a deterministic head: argmax (discrete) or tanh (continuous)."""

    def __init__(self, n_in: int, n_out: int, discrete: bool) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_in, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
            torch.nn.Linear(64, n_out),
        )
        self.discrete = discrete

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.net(obs.float())
        return out.argmax(-1) if self.discrete else torch.tanh(out)


def env_dims(env_id: str) -> tuple[int, int, bool]:
    env = gym.make(env_id)
    action, observation = env.action_space, env.observation_space
    assert observation.shape is not None and (isinstance(action, gym.spaces.Discrete) or action.shape is not None)
    discrete = isinstance(action, gym.spaces.Discrete)
    n_out = int(action.n) if isinstance(action, gym.spaces.Discrete) else int(np.prod(action.shape or ()))
    n_in = int(np.prod(observation.shape))
    env.close()
    return n_in, n_out, discrete


class DeterministicMLP(torch.nn.Module):
    """The same 2×64 tanh MLP and head as :class:`PolicyMLP`, on :class:`tdrl.models.MLP`."""

    def __init__(self, n_in: int, n_out: int, discrete: bool) -> None:
        from tdrl.models import MLP as TdrlMLP

        super().__init__()
        self.net = TdrlMLP(n_in, n_out, (64, 64), "tanh")
        self.discrete = discrete

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.net(obs)
        return out.argmax(-1) if self.discrete else torch.tanh(out)


def tdrl_mlp_policy(env_id: str):
    """The MLP rows' network as a tdrl model: it acts on tensors (:mod:`tdrl.models.acting`)."""
    from tdrl.models import ObservationModule

    torch.manual_seed(0)
    return ObservationModule(DeterministicMLP(*env_dims(env_id)))


def tdrl_ppo_policy(env_id: str):
    """tdrl's PPO actor and critic (2×64 tanh MLPs), both acting on tensors."""
    from tensordict.nn import TensorDictSequential

    from tdrl.envs import EnvFactory
    from tdrl.models import make_actor_critic

    torch.manual_seed(0)
    specs = EnvFactory(env_id).specs()
    ac = make_actor_critic(specs, distribution="categorical" if specs.discrete else "normal")
    return TensorDictSequential(ac.actor, ac.critic)


class Head(torch.nn.Module):
    """The deterministic head of :class:`MLP`: argmax (discrete) or tanh (continuous)."""

    def __init__(self, discrete: bool) -> None:
        super().__init__()
        self.discrete = discrete

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        return out.argmax(-1) if self.discrete else torch.tanh(out)


def user_policy(env_id: str):
    """The 2x64 tanh MLP as a TorchRL user writes it: a ``TensorDictModule`` over ``torchrl.modules.MLP``."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import MLP as TorchRLMLP

    torch.manual_seed(0)
    n_in, n_out, discrete = env_dims(env_id)
    net = torch.nn.Sequential(TorchRLMLP(in_features=n_in, out_features=n_out, num_cells=[64, 64],
                                         activation_class=torch.nn.Tanh), Head(discrete))
    # the act rows' weights: the same actions, so the envs (MuJoCo's contacts) cost the same per step
    with torch.no_grad():
        for dst, src in zip(net.parameters(), tdrl_mlp_policy(env_id).parameters(), strict=True):
            dst.copy_(src)
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])


def mlp_policy(env_id: str):
    from tensordict.nn import TensorDictModule

    torch.manual_seed(0)
    n_in, n_out, discrete = env_dims(env_id)
    return TensorDictModule(PolicyMLP(n_in, n_out, discrete), ["observation"], ["action"])


# ----------------------------------------------------------------------------- timing
class Row:
    """A measured configuration: ``run()`` produces ``frames`` frames; ``close()`` frees it."""

    def __init__(self, name: str, section: str, run: Callable[[], object], frames: int,
                 close: Callable[[], object] = lambda: None) -> None:
        self.name, self.section, self.run, self.frames, self.close = name, section, run, frames, close
        self.rates: list[float] = []
        self.cpu_rates: list[float] = []

    def time_once(self, seconds: float) -> None:
        cpu0 = tree_cpu_seconds()
        calls, start = 0, time.perf_counter()
        while True:
            self.run()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                break
        self.rates.append(calls * self.frames / elapsed)
        self.cpu_rates.append(calls * self.frames / max(tree_cpu_seconds() - cpu0, 1e-9))


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system) used so far by this process and all its descendants (Linux ``/proc``).

    Wall-clock frames/s depend on how much of the 2 cores other tenants leave us; frames per CPU-second do
    not, so the benchmark reports both (idle rows of other configurations use no CPU).
    """
    root = os.getpid() if root is None else root
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        cpu[pid] = (int(fields[11]) + int(fields[12])) / tick
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0.0)
        stack += children.get(pid, [])
    return total


def machine_busy(window: float = 0.4) -> float:
    """Fraction of all cores busy during ``window`` seconds (``/proc/stat``); call while this run is idle."""

    def snapshot() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + values[4]
        return sum(values) - idle, sum(values)

    busy0, total0 = snapshot()
    time.sleep(window)
    busy1, total1 = snapshot()
    return (busy1 - busy0) / max(total1 - total0, 1)


def wait_until_quiet(threshold: float, timeout: float) -> bool:
    """Block until other tenants use less than ``threshold`` of the machine (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if machine_busy() < threshold:
            return True
    return False


def measure_interleaved(rows: list[Row], seconds: float, repeats: int, quiet: float | None = None) -> None:
    """Warm every row up, then time them round-robin ``repeats`` times (load drifts hit all rows alike).

    With ``quiet`` (e.g. 0.1), each timed repeat starts only once other processes use less than that fraction
    of the machine (waiting up to 10 minutes): for shared machines, so 2-worker rows get their 2 cores.
    """
    for row in rows:
        row.run()
    for _ in range(repeats):
        for row in rows:
            if quiet is not None and not wait_until_quiet(quiet, 600):
                print(f"  (machine never quiet for {row.name}; timing anyway)", flush=True)
            row.time_once(seconds)


# ----------------------------------------------------------------------------- rows
def raw_loop(env_id: str, n_envs: int, seed: int = 0) -> tuple[Callable[[], None], Callable[[], None]]:
    """c's loop: ``SyncVectorEnv(n_envs)`` + the MLP, one batched forward per step; ``(run T steps, close)``."""
    vec = gym.vector.SyncVectorEnv([functools.partial(gym.make, env_id) for _ in range(n_envs)])
    return mlp_loop(vec, env_id, vec.reset(seed=seed)[0]), vec.close


def mlp_loop(vec, env_id: str, obs: np.ndarray) -> Callable[[], None]:
    """``T`` steps of a vector env ``vec`` (gymnasium API) driven by the benchmark MLP, one forward per step."""
    torch.manual_seed(0)
    mlp = PolicyMLP(*env_dims(env_id))
    state = {"obs": obs}

    def run() -> None:
        obs = state["obs"]
        with torch.no_grad():
            for _ in range(T):
                obs, *_ = vec.step(mlp(torch.from_numpy(obs)).numpy())
        state["obs"] = obs

    return run


def raw_row(env_id: str) -> Row:
    run, close = raw_loop(env_id, B)
    return Row("raw-vector-mlp", "mlp", run, B * T, close)


def _raw_loop_worker(env_id: str, n_envs: int, conn) -> None:
    """One half of ``raw-vector-mlp-2proc``: :func:`raw_loop` over ``n_envs`` envs, once per request."""
    torch.set_num_threads(1)
    run, close = raw_loop(env_id, n_envs, seed=n_envs)
    conn.send("ready")
    while conn.recv() == "run":
        run()
        conn.send("done")
    close()


def raw_two_process_row(env_id: str) -> Row:
    """c's loop split over two processes (``B/2`` envs each, nothing recorded, no data shared): what two
    independent single-process loops deliver on this machine at that moment. A shared machine does not always
    give a run two full cores (two busy vCPUs can land on one physical core); this row shows how much of the
    ``>= 1.5x c`` a 2-process collector could get from the cores alone in the same run."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(WORKERS)]
    procs = [ctx.Process(target=_raw_loop_worker, args=(env_id, B // WORKERS, child), daemon=True)
             for _, child in pipes]
    for proc in procs:
        proc.start()
    for parent, _ in pipes:
        parent.recv()

    def run() -> None:
        for parent, _ in pipes:
            parent.send("run")
        for parent, _ in pipes:
            parent.recv()

    def close() -> None:
        for (parent, _), proc in zip(pipes, procs, strict=True):
            parent.send("stop")
            proc.join(timeout=5)

    return Row("raw-vector-mlp-2proc", "mlp", run, B * T, close)


def envpool_row(env_id: str) -> Row | None:
    """envpool's C++ thread pool (2 threads) stepping ``B`` envs + the MLP, one batched forward per step."""
    try:
        envpool = importlib.import_module("envpool")  # optional ([bench]), untyped
    except Exception as err:  # not installed, or built for another numpy/python
        print(f"  envpool row skipped: cannot import envpool ({err}); pip install 'tdrl[bench]'", flush=True)
        return None
    env = envpool.make_gymnasium(env_id, num_envs=B, batch_size=B, num_threads=WORKERS, seed=0)
    return Row("envpool", "mlp", mlp_loop(env, env_id, env.reset()[0]), B * T, env.close)


class NormalizedEnvFactory:
    """``EnvFactory(env_id)`` with ``gymnasium.wrappers.NormalizeObservation`` around each env (picklable)."""

    def __init__(self, env_id: str) -> None:
        from tdrl.envs import EnvFactory

        self.factory = EnvFactory(env_id)

    def __call__(self, seed: int | None = None):
        return gym.wrappers.NormalizeObservation(self.factory(seed))

    def specs(self):
        return self.factory.specs()


def tdrl_row(name: str, section: str, kind: str, env_id: str, policy, compile: bool = False,
             norm: str | None = None) -> Row:
    """A tdrl collector row; ``norm`` ``"vecnorm"`` (TorchRL transform) or ``"gym"`` (gymnasium wrapper)."""
    from torchrl.envs import VecNorm

    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory

    factory = NormalizedEnvFactory(env_id) if norm == "gym" else EnvFactory(env_id)
    transform = VecNorm(in_keys=["observation"]) if norm == "vecnorm" else None
    collector = make_collector(kind, factory, policy, batch_B=B, batch_T=T, n_workers=WORKERS, seed=0,
                               compile=compile, transform=transform)
    return Row(name, section, collector.collect, B * T, collector.shutdown)


def _torchrl_env(env_id: str, n: int):
    from torchrl.envs import GymEnv, SerialEnv

    return SerialEnv(n, functools.partial(GymEnv, env_id, categorical_action_encoding=True))


def torchrl_row(config: str, env_id: str, frames_per_batch: int) -> Row:
    from torchrl.collectors import Collector, MultiSyncCollector

    policy = mlp_policy(env_id)
    if config == "Collector(SerialEnv(8))":
        collector = Collector(functools.partial(_torchrl_env, env_id, 8), policy,
                              frames_per_batch=frames_per_batch, total_frames=-1)
    else:
        n = 4 if config == "MultiSync(2xSerialEnv(4))" else 16
        collector = MultiSyncCollector([functools.partial(_torchrl_env, env_id, n)] * 2, policy,
                                       frames_per_batch=frames_per_batch, total_frames=-1)
    iterator = iter(collector)
    return Row(f"torchrl {config}", "torchrl", lambda: next(iterator), frames_per_batch, collector.shutdown)


def sb3_row(env_id: str) -> Row:
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    vec = DummyVecEnv([functools.partial(gym.make, env_id) for _ in range(B)])
    model = PPO("MlpPolicy", vec, n_steps=T, seed=0, device="cpu", verbose=0)
    _, callback = model._setup_learn(total_timesteps=10**12, callback=None)
    callback.on_training_start(locals(), globals())
    env = model.get_env()
    assert env is not None

    def run() -> None:
        model.collect_rollouts(env, callback, model.rollout_buffer, n_rollout_steps=T)

    return Row("sb3-rollout", "ppo", run, B * T, vec.close)


STARTUP_SCRIPT = """
import os, sys, time, torch
sys.path.insert(0, {bench_dir!r})
torch.set_num_threads(1)
from collectors import tdrl_mlp_policy
from tdrl.collect import ParallelCollector
from tdrl.envs import EnvFactory
if __name__ == "__main__":
    policy = tdrl_mlp_policy("HalfCheetah-v5")
    times = []
    for _ in range(2):
        start = time.perf_counter()
        c = ParallelCollector(EnvFactory("HalfCheetah-v5"), policy, batch_B=32, batch_T=128, n_workers=2, seed=0)
        times.append(time.perf_counter() - start)
        c.shutdown()
    print(times[0], times[1])
"""


def bench_startup() -> tuple[float, float]:
    script = STARTUP_SCRIPT.format(bench_dir=os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    cold, warm = out.stdout.strip().splitlines()[-1].split()
    return float(cold), float(warm)


# ----------------------------------------------------------------------------- Atari
ATARI_ID, ATARI_B = "ALE/Pong-v5", 2 * 4


def nature_cnn():
    """tdrl's greedy Nature-DQN actor for Pong and its plain network (``[n, 4, 84, 84]`` uint8 -> Q-values)."""
    from tdrl.envs import EnvFactory
    from tdrl.models import make_q_actor

    torch.manual_seed(0)
    actor = make_q_actor(EnvFactory(ATARI_ID).specs())
    return actor, actor.module[0].module


def atari_loop(vec, obs: np.ndarray, n_actions: int, cnn: bool) -> Callable[[], None]:
    """``T`` steps of an Atari vector env: random actions or the Nature CNN's greedy ones, one forward per step."""
    net = nature_cnn()[1] if cnn else None
    rng = np.random.default_rng(0)
    state = {"obs": obs}

    def run() -> None:
        obs = state["obs"]
        with torch.no_grad():
            for _ in range(T):
                if net is None:
                    action = rng.integers(n_actions, size=len(obs))
                else:
                    action = net(torch.from_numpy(obs)).argmax(-1).numpy()
                obs, *_ = vec.step(action)
        state["obs"] = obs

    return run


def atari_rows(skip: list[str]) -> list[Row]:
    """The Atari rows (module docstring), random policy then CNN."""
    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory, make_env

    factory = EnvFactory(ATARI_ID)
    n_actions = factory.specs().n_actions
    rows = []
    for policy_name, cnn in (("random", False), ("cnn", True)):
        if f"atari-{policy_name}" in skip:
            continue
        if "envpool" not in skip:
            try:
                envpool = importlib.import_module("envpool")  # optional ([bench]), untyped
                pool = envpool.make_gymnasium("Pong-v5", num_envs=ATARI_B, batch_size=ATARI_B, num_threads=WORKERS,
                                              seed=0, repeat_action_probability=0.25, use_fire_reset=False)
                rows.append(Row(f"envpool-atari-{policy_name}", "atari",
                                atari_loop(pool, pool.reset()[0], n_actions, cnn), ATARI_B * T, pool.close))
            except Exception as err:  # not installed, or built for another numpy/python
                print(f"  envpool Atari row skipped: {err}", flush=True)
        if "gym-async-atari" not in skip:
            vec = gym.vector.AsyncVectorEnv([functools.partial(make_env, ATARI_ID) for _ in range(ATARI_B)])
            rows.append(Row(f"gym-async-atari-{policy_name}", "atari",
                            atari_loop(vec, vec.reset(seed=0)[0], n_actions, cnn), ATARI_B * T, vec.close))
        for kind in ("parallel", "action_server") if cnn else ("parallel",):
            collector = make_collector(kind, factory, nature_cnn()[0] if cnn else None, batch_B=ATARI_B, batch_T=T,
                                       n_workers=WORKERS, seed=0, return_same_td=True)
            rows.append(Row(f"tdrl-{kind.replace('_', '-')}-atari-{policy_name}", "atari", collector.collect,
                            ATARI_B * T, collector.shutdown))
    return rows


def atari_replay_memory(directory: str, capacity: int = 4096) -> dict[str, float]:
    """GB of replay for 1M Atari transitions, from the bytes of ``capacity``-step buffers (8 streams)."""
    from tdrl.collect import make_collector
    from tdrl.envs import EnvFactory
    from tdrl.replay import FrameStack, SequenceReplayBuffer, TransitionReplayBuffer

    with make_collector("serial", EnvFactory(ATARI_ID), None, batch_B=ATARI_B, batch_T=64, seed=0) as collector:
        batch = collector.collect().clone()
    batch["h"] = torch.zeros(ATARI_B, 64, 1, 512)
    transitions = ["observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"),
                   ("next", "terminated"), ("next", "truncated"), "is_init"]
    buffers: dict[str, TransitionReplayBuffer | SequenceReplayBuffer] = {
        "stacks (TransitionReplayBuffer)": TransitionReplayBuffer(f"{directory}/plain", capacity, keys=transitions),
        "frame de-duplication (FrameStack)": TransitionReplayBuffer(
            f"{directory}/frames", capacity, frame_stack=FrameStack(4, padding="reset"), keys=transitions),
        "R2D1 sequences (SequenceReplayBuffer)": SequenceReplayBuffer(
            f"{directory}/seq", capacity, batch_T=8, warmup_T=8, lookahead_T=5, rnn_state_interval=32,
            state_keys=["h"], keys=[k for k in transitions if k != ("next", "observation")] + ["h"]),
    }
    out = {}
    for name, replay in buffers.items():
        replay.extend(batch)
        out[name] = replay.ring.store.nbytes() / capacity * 1e6 / 1e9
    return out


def atari_section(args, seconds: float, repeats: int, add) -> dict[str, float]:
    """Measure the Atari rows (added with ``add``) and the replay memory; returns the memory figures (GB)."""
    import tempfile

    try:
        import ale_py  # noqa: F401
    except ImportError:
        print("  Atari section skipped: pip install 'tdrl[atari]'", flush=True)
        return {}
    rows = atari_rows(args.skip)
    try:
        measure_interleaved(rows, seconds, repeats, args.quiet)
    finally:
        for row in rows:
            row.close()
    for row in rows:
        add(ATARI_ID, row.name, statistics.median(row.rates), row.section, statistics.median(row.cpu_rates))
    if "atari-replay-memory" in args.skip:
        return {}
    with tempfile.TemporaryDirectory() as directory:
        memory = atari_replay_memory(directory)
    for name, gb in memory.items():
        print(f"  replay of 1M Atari transitions, {name}: {gb:.1f} GB", flush=True)
    return memory


# ----------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    from report import add_markdown_option

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_markdown_option(parser)
    parser.add_argument("--quick", action="store_true", help="short timings, one TorchRL config (< 1 min)")
    parser.add_argument("--json", metavar="PATH", help="write every row as {env, collector, frames_per_s}")
    parser.add_argument("--envs", nargs="*", default=["CartPole-v1", "HalfCheetah-v5"])
    parser.add_argument("--seconds", type=float, default=None, help="seconds per timed repeat (3; quick 0.5)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per row (3; quick 1)")
    parser.add_argument("--skip", nargs="*", default=[], help="row names to skip (e.g. torchrl-best sb3-rollout)")
    parser.add_argument("--compile", action="store_true", help="tdrl rows: torch.compile the policy's act")
    parser.add_argument("--quiet", type=float, default=None, metavar="FRACTION",
                        help="shared machines: start each timed repeat only when other processes use less than "
                             "FRACTION of the cores (e.g. 0.1)")
    return parser


Results = list[dict[str, Any]]
"""The measured rows: ``{"env", "collector", "frames_per_s", "section", "frames_per_cpu_s"}`` each."""


def _add(rows: Results, env_id: str, name: str, fps: float, section: str = "mlp", per_cpu: float | None = None
         ) -> None:
    """Record one measured row and print it."""
    rows.append({"env": env_id, "collector": name, "frames_per_s": fps, "section": section,
                 "frames_per_cpu_s": per_cpu})
    extra = f" {per_cpu:12,.0f} frames/CPU-s" if per_cpu else ""
    print(f"  {env_id:15s} {name:34s} {fps:12,.0f} frames/s{extra}", flush=True)


def _baseline_rows(env_id: str, args: argparse.Namespace) -> list[Row]:
    """c, c on two processes, envpool and TorchRL's collectors, less the skipped ones."""
    rows: list[Row] = [raw_row(env_id)]
    if "raw-vector-mlp-2proc" not in args.skip:
        rows.append(raw_two_process_row(env_id))
    if "envpool" not in args.skip:
        rows += [row for row in [envpool_row(env_id)] if row is not None]
    if "torchrl-best" not in args.skip:
        configs = (["MultiSync(2xSerialEnv(4))"] if args.quick
                   else ["Collector(SerialEnv(8))", "MultiSync(2xSerialEnv(4))", "MultiSync(2xSerialEnv(16))"])
        rows += [torchrl_row(c, env_id, 1024 if args.quick else 4096) for c in configs]
    return rows


def _tdrl_rows(env_id: str, args: argparse.Namespace) -> list[Row]:
    """tdrl's collector kinds with its MLP model, with observation normalization, and with a user's module."""
    rows: list[Row] = []
    policy = tdrl_mlp_policy(env_id)
    for kind in ("serial", "parallel", "action_server", "alternating"):
        name = "tdrl-" + kind.replace("_", "-")
        if name not in args.skip:
            rows.append(tdrl_row(name, "mlp", kind, env_id, policy, args.compile))
    for kind in ("serial", "parallel"):
        for norm, label in (("vecnorm", "vecnorm"), ("gym", "gym-normobs")):
            if f"tdrl-{kind}-{label}" not in args.skip and "transforms" not in args.skip:
                rows.append(tdrl_row(f"tdrl-{kind}-{label}", "mlp", kind, env_id, policy, norm=norm))
    user = user_policy(env_id)
    for kind in ("serial", "parallel"):
        if f"user-tdm-{kind}" not in args.skip:
            rows.append(tdrl_row(f"user-tdm-{kind}", "mlp", kind, env_id, user, args.compile))
    return rows


def _ppo_rows(env_id: str, args: argparse.Namespace) -> list[Row]:
    """SB3's PPO rollout and tdrl's collectors with its PPO actor-critic."""
    rows: list[Row] = []
    if "sb3-rollout" not in args.skip:
        rows.append(sb3_row(env_id))
    ppo = tdrl_ppo_policy(env_id)
    for kind in ("serial", "parallel", "action_server"):
        name = f"tdrl-{kind.replace('_', '-')}-ppo"
        if name not in args.skip:
            rows.append(tdrl_row(name, "ppo", kind, env_id, ppo, args.compile))
    return rows


def _measure_env(env_id: str, args: argparse.Namespace, seconds: float, repeats: int, rows: Results) -> None:
    """Every row of ``env_id``, timed round-robin, then recorded (with the best TorchRL row after TorchRL's)."""
    env_rows = _baseline_rows(env_id, args) + _tdrl_rows(env_id, args) + _ppo_rows(env_id, args)
    try:
        measure_interleaved(env_rows, seconds, repeats, args.quiet)
    finally:
        for row in env_rows:
            row.close()
    torchrl = [statistics.median(r.rates) for r in env_rows if r.section == "torchrl"]
    for i, row in enumerate(env_rows):
        _add(rows, env_id, row.name, statistics.median(row.rates), row.section, statistics.median(row.cpu_rates))
        if row.section == "torchrl" and env_rows[i + 1].section != "torchrl":
            _add(rows, env_id, "torchrl-best", max(torchrl))


def _print_mlp_table(env_id: str, rows: Results, c: float | None, best: float | None) -> None:
    """The MLP rows of ``env_id`` against c and TorchRL's best."""
    print(f"{env_id}  (c = raw-vector-mlp, B={B}, T={T})")
    print(f"  {'collector':34s} {'frames/s':>12s} {'x c':>7s} {'x torchrl-best':>15s} {'frames/CPU-s':>13s}")
    for r in rows:
        if r["env"] != env_id or r["section"] == "ppo":
            continue
        fps = r["frames_per_s"]
        xc = f"{fps / c:7.2f}" if c else "      -"
        xt = f"{fps / best:15.1f}" if best else "              -"
        cpu = f"{r['frames_per_cpu_s']:13,.0f}" if r["frames_per_cpu_s"] else ""
        print(f"  {r['collector']:34s} {fps:12,.0f} {xc} {xt} {cpu}")


def _print_ratios(by_name: dict[str, float], c: float | None) -> None:
    """tdrl-parallel against envpool and c, user modules against ``act``, normalization's cost, the two cores."""
    parallel = by_name.get("tdrl-parallel")
    if parallel:
        ratios = [f"{parallel / by_name[k]:.2f}x {label}" for k, label in (("envpool", "envpool"),
                                                                         ("raw-vector-mlp", "c")) if by_name.get(k)]
        print(f"  tdrl-parallel = {', '.join(ratios)}")
    for kind in ("serial", "parallel"):
        user, act = by_name.get(f"user-tdm-{kind}"), by_name.get(f"tdrl-{kind}")
        if user and act:
            pool = f", {user / by_name['envpool']:.2f}x envpool" if by_name.get("envpool") else ""
            print(f"  user-tdm-{kind} = {user / act:.2f}x tdrl-{kind} (act){pool}")
    for kind in ("serial", "parallel"):
        ours, gym_norm, plain = (by_name.get(f"tdrl-{kind}{x}") for x in ("-vecnorm", "-gym-normobs", ""))
        if ours and gym_norm and plain:
            print(f"  observation normalization, {kind}: VecNorm transform {1e6 * (1 / ours - 1 / plain):+.2f} "
                  f"us/frame, gymnasium NormalizeObservation {1e6 * (1 / gym_norm - 1 / plain):+.2f} us/frame")
    two = by_name.get("raw-vector-mlp-2proc")
    if two and c:
        print(f"  two cores this run: raw-vector-mlp-2proc = {two / c:.2f}x c; "
              + ", ".join(f"{k} = {by_name[k] / two:.2f}x of it" for k in ("tdrl-parallel", "tdrl-action-server")
                          if k in by_name))


def _print_ppo_table(env_id: str, rows: Results, sb3: float | None) -> None:
    """The PPO actor-critic rows of ``env_id`` against SB3's rollout."""
    print(f"  PPO actor-critic (sampling, log-prob, value head)      {'x sb3-rollout':>15s}")
    for r in rows:
        if r["env"] == env_id and r["section"] == "ppo":
            xs = f"{r['frames_per_s'] / sb3:15.2f}" if sb3 else "              -"
            cpu = f"{r['frames_per_cpu_s']:13,.0f}" if r["frames_per_cpu_s"] else ""
            print(f"  {r['collector']:34s} {r['frames_per_s']:12,.0f} {'':7s} {xs} {cpu}")


def _print_env_results(env_id: str, rows: Results) -> None:
    by_name = {r["collector"]: r["frames_per_s"] for r in rows if r["env"] == env_id}
    c = by_name.get("raw-vector-mlp")
    _print_mlp_table(env_id, rows, c, by_name.get("torchrl-best"))
    _print_ratios(by_name, c)
    _print_ppo_table(env_id, rows, by_name.get("sb3-rollout"))
    print()


def _print_atari_results(rows: Results, memory: dict[str, float]) -> None:
    atari = {r["collector"]: r["frames_per_s"] for r in rows if r["env"] == ATARI_ID}
    if not atari:
        return
    print(f"{ATARI_ID}  (84x84x4 uint8, B={ATARI_B}: {WORKERS} workers x {ATARI_B // WORKERS}, T={T})")
    for r in rows:
        if r["env"] == ATARI_ID:
            print(f"  {r['collector']:34s} {r['frames_per_s']:12,.0f} {r['frames_per_cpu_s'] or 0:13,.0f}")
    for policy in ("random", "cnn"):
        ours, pool = atari.get(f"tdrl-parallel-atari-{policy}"), atari.get(f"envpool-atari-{policy}")
        if ours and pool:
            print(f"  tdrl-parallel-atari-{policy} = {ours / pool:.2f}x envpool-atari-{policy}")
    for name, gb in memory.items():
        print(f"  replay of 1M transitions, {name}: {gb:.1f} GB")
    print()


def _write_json(path: str, rows: Results, memory: dict[str, float], startup: tuple[float, float] | None) -> None:
    out: list[dict[str, Any]] = [{"env": r["env"], "collector": r["collector"], "frames_per_s": r["frames_per_s"]}
                                 for r in rows]
    out += [{"env": ATARI_ID, "collector": f"replay-1M {name}", "frames_per_s": None, "gb": gb}
            for name, gb in memory.items()]
    if startup is not None:
        out.append({"env": "HalfCheetah-v5", "collector": "tdrl-parallel-startup", "frames_per_s": None,
                    "startup_s": startup[0], "startup_warm_s": startup[1]})
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {path}")


def main() -> None:
    args = _parser().parse_args()
    seconds = args.seconds or (0.5 if args.quick else 3.0)
    repeats = args.repeats or (1 if args.quick else 3)
    torch.set_num_threads(1)
    rows: Results = []
    began = time.perf_counter()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; B={B} ({WORKERS} workers x {B // WORKERS}), T={T}, "
          f"median of {repeats} x >= {seconds:g} s", flush=True)
    for env_id in args.envs:
        _measure_env(env_id, args, seconds, repeats, rows)
    memory = atari_section(args, seconds, repeats, functools.partial(_add, rows)) if "atari" not in args.skip else {}
    startup = None
    if "tdrl-parallel-startup" not in args.skip:
        startup = bench_startup()
        print(f"  start-up of a 2-worker 32-env HalfCheetah ParallelCollector: cold {startup[0]:.2f} s, "
              f"warm {startup[1]:.2f} s", flush=True)

    print(f"\nResults (load average at end: {os.getloadavg()[0]:.2f}; {time.perf_counter() - began:.0f} s)\n")
    for env_id in args.envs:
        _print_env_results(env_id, rows)
    _print_atari_results(rows, memory)
    if startup is not None:
        print(f"tdrl-parallel-startup (HalfCheetah-v5, 2 workers x 16 envs): cold {startup[0]:.2f} s, "
              f"warm {startup[1]:.2f} s")
    if args.json:
        _write_json(args.json, rows, memory, startup)


if __name__ == "__main__":
    from report import markdown_page

    with markdown_page("Collectors"):  # --markdown PAGE#SECTION: into its docs section
        main()
