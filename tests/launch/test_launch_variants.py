"""Variants: rlpyt's crossing order and dir names, variant.json, strict merge into a recipe config."""

from __future__ import annotations

from pathlib import Path

import pytest

from tdrl.config import ConfigError, flatten, merge_nested
from tdrl.launch import VariantLevel, load_variant, make_variants, save_variant
from tdrl.launch.recipe import load_recipe

TINY_RECIPE = Path(__file__).resolve().parent / "tiny_recipe.py"


def test_levels_cross_in_order_first_level_slowest():
    lr = VariantLevel(keys=["optim.lr"], values=[[1e-3], [3e-4]], dir_names=["lr1e-3", "lr3e-4"])
    env = VariantLevel(
        keys=[("env", "id"), "collector.frames_per_batch"],
        values=[["CartPole-v1", 100], ["Acrobot-v1", 200], ["MountainCar-v0", 300]],
        dir_names=["cartpole", "acrobot", "mcar"],
    )
    variants, log_dirs = make_variants(lr, env)
    assert len(variants) == 6
    assert log_dirs == [
        "lr1e-3/cartpole",
        "lr1e-3/acrobot",
        "lr1e-3/mcar",
        "lr3e-4/cartpole",
        "lr3e-4/acrobot",
        "lr3e-4/mcar",
    ]
    assert variants[4] == {
        "optim": {"lr": 3e-4},
        "env": {"id": "Acrobot-v1"},
        "collector": {"frames_per_batch": 200},
    }
    # values of one level stay tied together (not a product within a level)
    assert {(v["env"]["id"], v["collector"]["frames_per_batch"]) for v in variants} == {
        ("CartPole-v1", 100),
        ("Acrobot-v1", 200),
        ("MountainCar-v0", 300),
    }
    assert flatten(variants[0]) == {  # the variant as dotted overrides
        "optim.lr": 1e-3,
        "env.id": "CartPole-v1",
        "collector.frames_per_batch": 100,
    }


def test_no_levels_is_one_empty_variant():
    assert make_variants() == ([{}], [""])


def test_variants_are_independent_copies():
    a = VariantLevel(["x.y"], [[[1, 2]]], ["a"])
    b = VariantLevel(["x.z"], [[1], [2]], ["b1", "b2"])
    variants, _ = make_variants(a, b)
    variants[0]["x"]["y"].append(3)
    assert variants[1]["x"]["y"] == [1, 2]


@pytest.mark.parametrize(
    "level, message",
    [
        (VariantLevel(["a"], [[1], [2]], ["only_one"]), "2 value sets but 1 dir_names"),
        (VariantLevel(["a", "b"], [[1]], ["x"]), "one value per key (2)"),
        (VariantLevel(["a"], [[1], [2]], ["x", "x"]), "not unique"),
        (VariantLevel(["a"], [[1]], ["../escape"]), "relative path"),
        (VariantLevel(["a", ("a",)], [[1, 2]], ["x"]), "appears twice"),
    ],
)
def test_malformed_levels_fail_with_the_reason(level, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make_variants(level)


def test_a_key_set_by_two_levels_is_an_error():
    with pytest.raises(ValueError, match="'optim.lr' is set by levels 0 and 1"):
        make_variants(
            VariantLevel(["optim.lr"], [[1]], ["a"]), VariantLevel([("optim", "lr")], [[2]], ["b"])
        )


def test_save_and_load_variant(tmp_path):
    variant = {"optim": {"lr": 1e-3}, "env": {"id": "CartPole-v1"}}
    path = save_variant(variant, tmp_path / "a" / "run_0")
    assert path.name == "variant.json"
    assert load_variant(tmp_path / "a" / "run_0") == variant


def test_strict_merge_into_recipe_config_names_the_bad_key():
    config = load_recipe(TINY_RECIPE).Config()
    variants, _ = make_variants(VariantLevel(["train.lr"], [[0.5]], ["lr"]))
    merged = merge_nested(config, variants[0])
    assert merged.train.lr == 0.5 and config.train.lr != 0.5  # a new config, the default untouched
    bad, _ = make_variants(VariantLevel(["train.lrr"], [[0.5]], ["lr"]))
    with pytest.raises(
        ConfigError, match=r"unknown config key 'train.lrr'; did you mean 'train.lr'"
    ):
        merge_nested(config, bad[0])
    with pytest.raises(ConfigError, match="train.iterations"):
        merge_nested(config, {"train": {"iterations": "many"}})
