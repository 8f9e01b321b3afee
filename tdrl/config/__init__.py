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

The algorithm families' sections are in :mod:`tdrl.config.algorithms`, the trainer sections (``trainer.kind``, ddp
ranks, Ray actors) in :mod:`tdrl.config.trainer`; every name is importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

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
from tdrl.config.trainer import (
    ApeXTrainerConfig,
    ImpalaTrainerConfig,
    OffPolicyTrainerConfig,
    OnPolicyTrainerConfig,
    RayConfig,
    TrainerConfig,
    check_ray_address,
    trainer_kinds,
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
           "GroupedEnvConfig",
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
    data in a quarter of its memory, under the sync trainer only, and the replay has no frame stack (Atari's frames
    go to the GPU with ``replay.device=cuda``)."""
    kind = getattr(getattr(cfg, "trainer", None), "kind", "sync")
    return {"cuda": True, "cpu": False, "auto": None if kind == "sync" else False}[cfg.replay.device]


# --- Shared sections -------------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """The training environment."""

    id: str = "CartPole-v1"
    """Gymnasium id (classic control, MuJoCo ``HalfCheetah-v5``, Atari ``ALE/Pong-v5``)."""


@dataclass
class GroupedEnvConfig(EnvConfig):
    """The training environment of a multi-agent recipe: its id and the env's own arguments."""

    options: list[str] = field(default_factory=list)
    """The env's own arguments as name=value (a VMAS scenario's, a PettingZoo or lbforaging env's), e.g.
    [N=5,local_ratio=0.3] or [n_agents=4]; numbers, true/false and none parse, anything else is a string."""

    def validate(self) -> None:
        self.kwargs()  # a malformed option fails with the config, before torch loads

    def kwargs(self) -> dict[str, Any]:
        """``options`` as keyword arguments for the env (``ConfigError``, one line, for an item that is not
        name=value or that names an argument tdrl sets itself)."""
        out: dict[str, Any] = {}
        for item in self.options:
            name, eq, text = (part.strip() for part in item.partition("="))
            if not eq or not name.isidentifier():
                raise ConfigError(f"config key 'env.options': {item!r} is not name=value (e.g. [N=5,local_ratio=0.3])")
            if name in _SET_BY_TDRL:
                raise ConfigError(f"config key 'env.options': {name} is set by tdrl ({_SET_BY_TDRL[name]})")
            out[name] = _option_value(text)
        return out


_SET_BY_TDRL = {"group_map": "the recipe's group map", "num_envs": "collector.batch_B", "device": "run.device",
                "max_episode_steps": "the env's time limit"}


def _option_value(text: str) -> Any:
    """An option's value: an int, a float, true/false, none, else the text itself."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


@dataclass
class AtariEnvConfig(EnvConfig):
    """The training environment of a recipe that plays Atari games (DQN, R2D1, PPO, A2C, IMPALA); evaluation plays
    whole games."""

    episodic_lives: bool = False
    """Atari: a lost life ends the RL episode (agent reset, no bootstrap), the game goes on (rlpyt: True)."""


@dataclass
class CollectorConfig:
    """The training collector and the run's budget."""

    kind: Literal["serial", "parallel", "action_server", "alternating", "torchrl", "batched_env"] = "serial"
    """serial: one process (small nets, debugging); parallel: worker processes each act with a policy copy (CPU
    policies, slow envs); action_server: workers step, this process acts batched (a GPU policy); alternating: two
    worker groups, one steps while this process acts for the other (a GPU policy whose step takes as long as the
    envs'); torchrl: TorchRL's own collectors (a reference; reset-at-once only; a resumed run restarts episodes);
    batched_env: one torch env object steps all batch_B envs in this process (VMAS, env.id=vmas/...; its only kind)."""
    n_workers: Count = 2
    """Worker processes (alternating: per group; torchrl: one SerialEnv each); they divide batch_B evenly."""
    batch_B: Count = 8
    """Environments stepped together (rlpyt batch_B; the batch's first dim)."""
    batch_T: Count = 32
    """Time steps per env per iteration (rlpyt batch_T; the batch's second dim)."""
    total_frames: Count = 100_000
    """Env frames to train for, at least (rlpyt n_steps): ceil(total_frames / frames per iteration) iterations
    (batch_B * batch_T frames, times the ranks with trainer.kind=ddp), rounded up to whole log intervals."""

    def validate(self) -> None:
        if self.kind == "alternating":
            _check(self.batch_B % (2 * self.n_workers) == 0, f"collector.batch_B={self.batch_B} must be divisible by "
                   f"2 * collector.n_workers={2 * self.n_workers} (two groups of n_workers workers, each stepping "
                   "the same number of envs)")
        _check(self.kind in ("serial", "batched_env") or self.batch_B % self.n_workers == 0,
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
    """torch intra-op threads of the main process, at most the cores it may run on (small nets on few cores are
    fastest with 1)."""
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

