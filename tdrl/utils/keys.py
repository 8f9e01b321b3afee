"""The batch keys more than one package reads or writes, defined once (the data contract, docs/design.md §1)."""

from __future__ import annotations

OBS_KEY = "observation"
INIT_KEY = "is_init"
PREV_REWARD_KEY = "prev_reward"
MASK_KEY = ("collector", "mask")  # False on wait-reset idle steps
TRAJ_KEY = ("collector", "traj_ids")
ENV_INDEX_KEY = ("collector", "env_index")
VERSION_KEY = ("collector", "policy_version")
WEIGHT_KEY = "priority_weight"  # prioritized replay's importance weight, read by TorchRL's losses
STEPS_KEY = "steps_to_next_obs"  # n-step window length, read by TorchRL's value estimators
RECURRENT_KEYS = (("recurrent_state", "h"), ("recurrent_state", "c"))
NEXT_RECURRENT_KEYS = tuple(("next", *key) for key in RECURRENT_KEYS)
