"""A finished LoRA run dir for the fault tests: plan.json, final/ with its adapter config, no weights."""

from __future__ import annotations

import json
from pathlib import Path

import yaml


def finished_lora_run(folder: Path, model: Path, adapter_config: dict):
    """A run of recipe `folder/recipe.yaml` (model `model`, output `folder/runs/unit`), marked and complete, whose
    final/ holds `adapter_config` and ftune.json: nothing in it is loaded, so no weights are written."""
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from ftune.rundir import RunDir, mark_complete

    recipe = {"name": "unit", "model": {"path": str(model)},
              "data": {"train": [{"path": str(folder / "train.jsonl"), "format": "instruction"}]},
              "train": {"max_steps": 1}, "output": {"dir": str(folder / "runs" / "unit")}}
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    plan = compile_plan(load_recipe(str(folder / "recipe.yaml")), check_inputs=False)
    run = RunDir(Path(plan.run_dir))
    run.root.mkdir(parents=True)
    run.marker.write_text("{}")
    run.plan.write_text(plan.model_dump_json())
    run.final.mkdir()
    (run.final / "ftune.json").write_text(json.dumps({"method": "lora", "quantization": None}))
    (run.final / "adapter_config.json").write_text(json.dumps(adapter_config))
    mark_complete(run.final, {"tensors": 1})
    return run
