"""The config sections of tdrl's recipes: typed dataclasses with dotted ``key=value`` overrides
(``python recipes/sac.py env.id=Hopper-v5 optim.lr=3e-4``; parsing, ``--help`` and one-line errors are
:mod:`tdrl.utils.dotted_config`).

The sections several recipes have live here, so common keys are spelled the same everywhere (``env.id``,
``collector.batch_B``, ``run.seed``...); a recipe subclasses a section to add keys or change defaults, or changes
them with ``field(default_factory=lambda: CollectorConfig(batch_B=1))``. Every numeric field declares its valid
range in its type (``lr: PositiveFloat``, ``Annotated[int, Range(ge=-1)]``), checked whenever a value is set and
shown in ``--help``; a section's ``validate(self)`` raises :class:`ConfigError` for values that cannot work
together. This module imports nothing heavy, so a recipe that imports only it at the top (torch, TorchRL and
tdrl's other layers inside ``main``) reports a bad key or value in well under a second.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from tdrl.config.algorithms import (
    A2COptimConfig,
    ActionNoiseConfig,
    ActorCriticModelConfig,
    ContinuousLossConfig,
    ContinuousModelConfig,
    DeterministicPolicyOptimConfig,
    OffPolicyLossConfig,
    OffPolicyOptimConfig,
    PolicyGradientLossConfig,
    PolicyGradientOptimConfig,
    PrioritizedReplayConfig,
    ReplayConfig,
    ReplayDevice,
)
from tdrl.utils.dotted_config import (
    ConfigError,
    apply_overrides,
    config_help,
    diff_configs,
    flatten,
    merge_nested,
    parse_args,
    run_recipe,
    to_dict,
    user_errors,
    validate,
)
from tdrl.utils.errors import UserError
from tdrl.utils.ranges import (
    AnyFloat,
    Count,
    Fraction,
    LayerSizes,
    Length,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveFraction,
    Range,
)

__all__ = ["A2COptimConfig", "ActionNoiseConfig", "ActorCriticModelConfig", "AnyFloat", "ApeXEpsilonGreedyConfig",
           "ApeXTrainerConfig", "AtariEnvConfig", "CheckpointConfig", "CollectorConfig", "ConfigError",
           "ContinuousControlConfig", "ContinuousLossConfig", "ContinuousModelConfig", "Count",
           "DeterministicPolicyOptimConfig", "EnvConfig", "EpsilonGreedyConfig", "EvalConfig", "Fraction",
           "ImpalaTrainerConfig", "LayerSizes", "Length", "LoggerConfig", "NonNegativeFloat", "NonNegativeInt",
           "OffPolicyLossConfig", "OffPolicyOptimConfig", "OffPolicyTrainerConfig", "OnPolicyTrainerConfig",
           "PolicyGradientLossConfig", "PolicyGradientOptimConfig", "PositiveFloat", "PositiveFraction",
           "PrioritizedReplayConfig", "Range", "RayConfig", "RecipeConfig", "ReplayConfig", "ReplayDevice", "RunConfig",
           "TrainerConfig", "UserError", "apply_overrides", "check_devices", "check_ray_address", "config_help",
           "diff_configs", "flatten", "merge_nested", "parse_args", "replay_copy", "run_recipe", "to_dict",
           "trainer_kinds", "user_errors", "validate"]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def check_devices(cfg: Any) -> None:
    """Raise :class:`ConfigError` for device settings that cannot work (a recipe's ``Config.validate`` calls this, so
    the launch fails before torch loads): ``optim.cudagraphs=true`` without ``run.device=cuda`` (a CUDA graph replays
    GPU work; on the CPU it would silently do nothing), ``replay.device=cuda`` without ``run.device=cuda`` or with
    ``trainer.kind=async`` (the GPU copy follows the writes of this process)."""
    cuda = cfg.run.device.partition(":")[0] == "cuda"
    _check(not cfg.optim.cudagraphs or cuda, f"optim.cudagraphs=true replays CUDA graphs, but run.device="
           f"{cfg.run.device!r}; set run.device=cuda or optim.cudagraphs=false")
    replay = cfg.replay.device
    _check(replay != "cuda" or cuda, f"replay.device=cuda keeps a copy of the replay on the GPU, but run.device="
           f"{cfg.run.device!r}; set run.device=cuda or replay.device=cpu")
    kind = getattr(getattr(cfg, "trainer", None), "kind", "sync")
    _check(replay != "cuda" or kind == "sync", f"replay.device=cuda needs trainer.kind=sync (the GPU copy follows "
           f"the writes of the learner's process); trainer.kind={kind}")


def replay_copy(cfg: Any) -> bool | None:
    """``copy_on_device`` of a ``TransitionReplayBuffer`` for ``replay.device``: ``cuda`` copies the stored data to
    ``run.device`` and gathers samples there, ``cpu`` gathers them in host memory and copies each over (pinned,
    non-blocking), ``auto`` copies (``None``: the buffer decides) when ``run.device`` is a GPU with room for the
    data in a quarter of its memory, under the sync trainer only."""
    kind = getattr(getattr(cfg, "trainer", None), "kind", "sync")
    return {"cuda": True, "cpu": False, "auto": None if kind == "sync" else False}[cfg.replay.device]


# --- Shared sections -------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """The training environment."""

    id: str = "CartPole-v1"
    """Gymnasium id (classic control, MuJoCo ``HalfCheetah-v5``, Atari ``ALE/Pong-v5``)."""


@dataclass
class AtariEnvConfig(EnvConfig):
    """The training environment of a recipe that plays Atari games (DQN, R2D1, PPO, A2C, IMPALA); evaluation plays
    whole games."""

    episodic_lives: bool = False
    """Atari: a lost life ends the RL episode (agent reset, no bootstrap), the game goes on (rlpyt: True)."""


@dataclass
class CollectorConfig:
    """The training collector and the run's budget."""

    kind: Literal["serial", "parallel", "action_server"] = "serial"
    """serial (one process), parallel (CPU workers), action_server (workers step, main process acts)."""
    n_workers: Count = 2
    """Worker processes of the parallel/action_server collectors (must divide batch_B)."""
    batch_B: Count = 8
    """Environments stepped together (rlpyt batch_B; the batch's first dim)."""
    batch_T: Count = 32
    """Time steps per env per iteration (rlpyt batch_T; the batch's second dim)."""
    total_frames: Count = 100_000
    """Env frames to train for, at least (rlpyt n_steps): ceil(total_frames / frames per iteration) iterations
    (batch_B * batch_T frames, times the ranks with trainer.kind=ddp), rounded up to whole log intervals."""

    def validate(self) -> None:
        _check(self.kind == "serial" or self.batch_B % self.n_workers == 0,
               f"collector.batch_B={self.batch_B} must be divisible by collector.n_workers={self.n_workers} (each "
               f"{self.kind} worker steps the same number of envs)")


@dataclass
class EpsilonGreedyConfig:
    """Epsilon-greedy exploration of the value-based recipes (DQN, R2D1); each re-declares it with its defaults."""

    eps_init: Fraction = 1.0
    """Epsilon until optim.min_steps_learn frames."""
    eps_final: Fraction = 0.04
    """Final epsilon (the largest per-env final value with vector epsilon)."""
    eps_final_min: PositiveFraction | None = None
    """Smallest per-env final epsilon, log-spaced over the envs (rlpyt's and Ape-X's vector epsilon); None: one
    epsilon for all envs."""
    eps_steps: NonNegativeInt = 9_000
    """Env frames at which epsilon reaches its final value (rlpyt eps_steps)."""
    eps_eval: Fraction = 0.001
    """Epsilon of evaluation episodes (rlpyt eps_eval)."""

    def validate(self) -> None:
        _check(self.eps_final_min is None or self.eps_final_min <= self.eps_final,
               f"exploration.eps_final_min={self.eps_final_min} must be <= exploration.eps_final={self.eps_final} "
               "(the per-env final epsilons are log-spaced between them)")


@dataclass
class EvalConfig:
    """Offline evaluation (rlpyt MinibatchRlEval): whole greedy episodes on dedicated envs."""

    n_envs: NonNegativeInt = 10
    """Evaluation episodes at iteration 0 and every log interval; 0 logs online training episodes instead."""
    max_steps: NonNegativeInt = 0
    """Time limit of evaluation episodes; 0 uses the env's own (1000 if it has none)."""
    video: bool = False
    """Record one greedy episode per evaluation as ``videos/video_<frames>.mp4`` in the run directory (and W&B)."""

    def validate(self) -> None:
        _check(not self.video or self.n_envs >= 1, "eval.video=true records an evaluation episode, so it needs "
               "eval.n_envs >= 1")


@dataclass
class RunConfig:
    """Where a run lives and how it is seeded. Common to every recipe."""

    root: str = "runs"
    """Directory under which run directories are created (``<root>/<date>/<time>_<name>/run_<seed>``)."""
    dir: str = ""
    """This run's directory, explicitly. Launching again with the same ``run.dir`` resumes the run there."""
    name: str = ""
    """Run name used in the directory and W&B; empty means the recipe's name."""
    seed: NonNegativeInt = 0
    """Seed for python, numpy, torch and the environments."""
    device: str = "cpu"
    """Device of the learner (``cpu``, ``cuda``, ``cuda:1``)."""
    torch_threads: Count = 1
    """torch intra-op threads of the main process (small nets on few cores are fastest with 1)."""
    flush_denormal: bool = True
    """Denormal floats as zero on the CPU (``torch.set_flush_denormal``): Adam's idle moments decay into that slow
    range (updates 1.2-1.4x faster, docs/throughput.md#phases); false for IEEE arithmetic below 1e-38."""
    force: bool = False
    """Go ahead where a launch would stop and change nothing: resume even if the saved config differs from this one
    (or the run finished: e.g. to train on with a larger budget), start over when none of the run directory's
    checkpoints loads, and use a run.dir that is an existing folder of other files."""

    def validate(self) -> None:
        kind, _, index = self.device.partition(":")
        _check(kind in ("cpu", "cuda", "mps") and (not index or index.isdigit()),
               f"run.device={self.device!r} is not a device; use cpu, cuda, cuda:<index> or mps")


@dataclass
class LoggerConfig:
    """Metric sinks: console, progress.csv, W&B."""

    log_interval_steps: Count = 10_000
    """Env frames between log rows and evaluations (rlpyt's ``log_interval_steps``), rounded down to whole
    iterations (at least one; a run shorter than it logs once, at its end)."""
    wandb: bool = True
    """Mirror metrics to Weights & Biases (the run directory stays the source of truth)."""
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """W&B mode; offline needs no account (``wandb sync`` later)."""
    project: str = "tdrl"
    """W&B project."""
    entity: str = ""
    """W&B entity (team or user); empty means the default."""
    group: str = ""
    """W&B group, e.g. the sweep or experiment name."""
    tensorboard: bool = False
    """Also write TensorBoard event files."""
    progress_bar: bool = True
    """Show a tqdm progress bar (it turns itself off when stderr is not a terminal)."""


@dataclass
class CheckpointConfig:
    """Snapshots (rlpyt's snapshot modes) and resume."""

    snapshot_mode: Literal["none", "last", "all", "gap", "gap_and_last"] = "last"
    """Which checkpoints to keep: none, the last two (the one before the newest survives a bad newest), all, every
    ``snapshot_gap`` iterations, or those multiples plus the last two."""
    snapshot_gap: Count = 10
    """Iterations between kept checkpoints in ``gap`` modes."""
    interval_steps: NonNegativeInt = 0
    """Env frames between checkpoints; 0 means at every log interval."""
    strict_resume: bool = False
    """Fail on a corrupt latest checkpoint instead of falling back to the previous valid one."""


@dataclass
class ApeXEpsilonGreedyConfig(EpsilonGreedyConfig):
    """Epsilon-greedy exploration of a value-based recipe with Ape-X actors (DQN): each actor its own epsilon."""

    actor_eps: PositiveFraction = 0.4
    """trainer.kind=ray: actor i of N explores with actor_eps ** (1 + actor_eps_alpha * i / (N - 1)) (Ape-X)."""
    actor_eps_alpha: NonNegativeFloat = 7.0
    """trainer.kind=ray: exponent spread of the actors' epsilons (Ape-X: 7)."""


def check_ray_address(address: str, source: str) -> None:
    """Raise :class:`ConfigError` unless ``address`` is ``host:port`` (or one Ray resolves itself: ``auto``,
    ``local``, ``ray://...``). ``source`` names where the value came from (``trainer.ray_address`` or the
    ``RAY_ADDRESS`` environment variable), so the line blames the setting the user has to change."""
    if address in ("auto", "local") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{source}={address!r} is not host:port (e.g. 10.0.0.5:6379, as `ray start --head` prints "
                          f"it); set it to the cluster's address, or {_unset(source)} for a Ray of this run's own")


def _unset(source: str) -> str:
    return f"unset {source}" if source.isupper() else f"leave {source} empty"


@dataclass
class _TrainerKind:
    kind: Literal["sync", "ddp", "async", "ray"] = "sync"
    """sync: collect, then update, in one process (rlpyt MinibatchRl); ddp: world_size full replicas, gradients
    all-reduced (rlpyt SyncRl); async: collector process + optimizer process on a shared replay (rlpyt AsyncRl,
    off-policy only); ray: n_actors collector actors anywhere in a Ray cluster, the learner here (Ape-X with a
    replay, IMPALA without)."""


@dataclass
class _DataParallelKeys:
    world_size: Count = 2
    """ddp: number of ranks (local processes; under torchrun/SLURM it must equal WORLD_SIZE)."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """ddp: torch.distributed backend; auto = NCCL on CUDA devices, gloo on CPU."""


@dataclass
class _CollectorProcessKeys:
    max_lag_frames: Annotated[int, Range(ge=-1)] = 0
    """async, ray: frames the collectors may run ahead of the optimizer beyond one batch (ray: one rollout) each
    (0: the replay ratio holds); -1: no limit (rlpyt's AsyncRl, Ape-X's actors: fewer updates per frame when the
    optimizer is slower). ray: an Ape-X rollout call carries up to 50 ms of batches within its share of these
    frames, so larger values also cut Ray's cost per frame."""
    updates_per_sync: Count = 1
    """async, ray: gradient updates between weight publications to the collectors."""


@dataclass
class RayConfig:
    """The Ray actors and cluster of ``trainer.kind=ray`` (:class:`tdrl.train.RayTrainer`); part of the trainer
    sections of the recipes that wire up Ray (``trainer.n_actors=8``)."""

    n_actors: Count = 4
    """ray: collector actors (each builds the recipe's collector, with its own seed)."""
    spare_actors: NonNegativeInt = 1
    """ray: idle collector actors kept built, reserving no CPU, each ready to take a dead actor's place at once (0:
    Ray restarts the dead actor, a new process that imports torch and builds its collector: seconds)."""
    ray_address: str = ""
    """ray: the cluster to join (host:port); empty: RAY_ADDRESS if set, else Ray starts on this machine."""
    actor_cpus: PositiveFloat = 1.0
    """ray: CPUs each collector actor reserves in the cluster."""
    call_timeout_s: PositiveFloat = 60.0
    """ray: a rollout or hub call taking longer has its actor killed and restarted (a lost node)."""

    def validate(self) -> None:
        if self.ray_address:
            check_ray_address(self.ray_address, "trainer.ray_address")


@dataclass
class _UnrollKeys:
    unrolls_per_batch: Count = 1
    """ray, on-policy (IMPALA): actors' unrolls concatenated into one learner batch."""


# A trainer section is its kinds and the keys those kinds read; a recipe's ``trainer`` field takes the one that names
# the kinds it wires up, so its --help lists no kind it refuses and no key it ignores. The bases are listed last
# field first: dataclasses collect fields from the end of the MRO, so ``kind`` comes first.


@dataclass
class TrainerConfig(_UnrollKeys, RayConfig, _CollectorProcessKeys, _DataParallelKeys, _TrainerKind):
    """Which trainer runs the loop, and its process settings (:func:`tdrl.train.make_trainer`): every kind and
    key, for a script of one's own. Recipes take the section naming the kinds they wire up."""


@dataclass
class OnPolicyTrainerConfig(_DataParallelKeys, _TrainerKind):
    """The trainer of an on-policy recipe (PPO): sync, or ddp."""

    kind: Literal["sync", "ddp"] = "sync"
    """sync: collect, then update, in one process (rlpyt MinibatchRl); ddp: world_size full replicas, gradients
    all-reduced (rlpyt SyncRl)."""


@dataclass
class OffPolicyTrainerConfig(_CollectorProcessKeys, _TrainerKind):
    """The trainer of an off-policy recipe (SAC, TD3, R2D1): sync, or async."""

    kind: Literal["sync", "async"] = "sync"
    """sync: collect, then update, in one process (rlpyt MinibatchRl); async: a collector process fills the replay
    while this one optimises (rlpyt AsyncRl)."""
    max_lag_frames: Annotated[int, Range(ge=-1)] = 0  # the docs without Ray's part
    """async: frames the collector process may run ahead of the optimizer beyond one batch (0: the replay ratio
    holds); -1: no limit (rlpyt's AsyncRl: fewer updates per frame when the optimizer is slower)."""
    updates_per_sync: Count = 1
    """async: gradient updates between weight publications to the collector process."""


@dataclass
class ApeXTrainerConfig(RayConfig, _CollectorProcessKeys, _TrainerKind):
    """The trainer of an off-policy recipe with Ape-X (DQN, DDPG): sync, async, or ray."""

    kind: Literal["sync", "async", "ray"] = "sync"
    """sync: collect, then update, in one process (rlpyt MinibatchRl); async: a collector process fills the replay
    while this one optimises (rlpyt AsyncRl); ray: n_actors collector actors anywhere in a Ray cluster write into
    this learner's replay (Ape-X)."""


@dataclass
class ImpalaTrainerConfig(_UnrollKeys, RayConfig, _TrainerKind):
    """The trainer of an on-policy recipe that corrects for the actors' lag (IMPALA's V-trace): sync, or ray."""

    kind: Literal["sync", "ray"] = "sync"
    """sync: collect with the learner's weights, then update, in one process; ray: n_actors collector actors
    anywhere in a Ray cluster send version-tagged unrolls to this learner."""


def trainer_kinds(section: Any) -> tuple[str, ...]:
    """The trainer kinds a trainer section names (its ``kind`` field's choices): what its recipe wires up."""
    return typing.get_args(typing.get_type_hints(type(section))["kind"])


# --- The recipe config ---------------------------------------------------------------------------------


@dataclass
class RecipeConfig:
    """The sections every recipe has. A recipe's ``Config`` subclasses it, adds its algorithm's sections (model,
    loss, optim, ...) and re-declares a section to change its defaults."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    """Training collector and budget."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Offline evaluation (rlpyt MinibatchRlEval)."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory, seed, device."""
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    """Logging cadence and sinks."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Snapshots and resume."""
    stop_return: AnyFloat | None = None
    """Stop once the evaluation return reaches this (benchmarks); None trains the whole budget."""


@dataclass
class ContinuousControlConfig(RecipeConfig):
    """The sections SAC, TD3 and DDPG share: Pendulum-v1, one env stepped one step per iteration, a replay, their
    network widths. Each recipe adds its loss and optim sections (and exploration, trainer)."""

    env: EnvConfig = field(default_factory=lambda: EnvConfig(id="Pendulum-v1"))
    collector: CollectorConfig = field(
        default_factory=lambda: CollectorConfig(batch_B=1, batch_T=1, total_frames=20_000))
    logger: LoggerConfig = field(default_factory=lambda: LoggerConfig(log_interval_steps=1_000))
    model: ContinuousModelConfig = field(default_factory=ContinuousModelConfig)
    """Policy and critics."""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """Replay buffer."""

    def validate(self) -> None:
        check_devices(self)

