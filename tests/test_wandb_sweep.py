"""The shipped W&B sweep: every parameter value is a valid override of the Hydra config."""

from __future__ import annotations

import itertools

import yaml

from tests.conftest import ROOT, compose_config

SWEEP = ROOT / "experiments" / "wandb_sweep.yaml"


def sweep_runs() -> list[list[str]]:
    """The override lists a grid sweep hands ``${args_no_hyphens}``: one per combination."""
    params = yaml.safe_load(SWEEP.read_text())["parameters"]
    axes = [[f"{key}={value}" for value in (spec["values"] if "values" in spec else [spec["value"]])]
            for key, spec in params.items()]
    return [list(combination) for combination in itertools.product(*axes)]


def test_sweep_command_runs_summrl_train_with_hydra_overrides():
    sweep = yaml.safe_load(SWEEP.read_text())
    assert sweep["command"] == ["${env}", "${interpreter}", "-m", "summrl.train", "${args_no_hyphens}"]
    assert sweep["metric"]["name"] == "val/qa_accuracy"  # a key ART's history actually logs


def test_every_sweep_run_composes_and_validates():
    runs = sweep_runs()
    assert len(runs) == 12
    for overrides in runs:
        config = compose_config(overrides)
        values = dict(o.split("=", 1) for o in overrides)
        # length_penalized is a preset of the weighted reward: qa plus a length term
        kinds = {"weighted": {"qa", "length"}} if values["reward"] == "length_penalized" else {values["reward"]: set()}
        assert {config.reward.kind: set(getattr(config.reward, "terms", {}))} == kinds
        assert config.model.lr == float(values["model.lr"]) and config.seed == int(values["seed"])
        assert config.logger.kind == "wandb"
