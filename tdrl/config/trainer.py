"""The trainer sections: which trainer runs a recipe's loop (``trainer.kind``) and the keys its kinds read, the
data-parallel ranks (``ddp``), the collector processes (``async``, ``ray``) and the Ray actors and cluster
(:class:`RayConfig`). Re-exported by :mod:`tdrl.config`; import them from there."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from tdrl.utils.dotted_config import ConfigError
from tdrl.utils.ranges import Count, NonNegativeInt, PositiveFloat, Range

__all__ = ["ApeXTrainerConfig", "ImpalaTrainerConfig", "OffPolicyTrainerConfig", "OnPolicyTrainerConfig", "RayConfig",
           "TrainerConfig", "check_ray_address", "trainer_kinds"]


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
    """The Ray actors and cluster of ``trainer.kind=ray`` (:class:`tdrl.distributed.RayTrainer`); part of the trainer
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
    """Which trainer runs the loop, and its process settings (:func:`tdrl.wiring.make_trainer`): every kind and
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
