"""ALST's tiling levers through `ftune run`: the tiled MLP (`train.tiled_mlp`) and the tiled loss
(`train.tiled_loss`) train what the untiled model trains (loss curve and the adapter's weights), with LoRA on every
linear layer and gradient checkpointing, on CPU; the loss on packed rows."""

from __future__ import annotations

import pytest

from tests.e2e._util import base_recipe, ftune, losses, write_recipe

pytestmark = pytest.mark.slow

LEVERS = {"mlp": ({"tiled_mlp": True, "tiled_mlp_shards": 3}, "tiled MLP: 2 decoder MLPs, slices: 3"),
          "loss": ({"tiled_loss": True, "tiled_loss_shards": 3}, "tiled loss: the output head and loss in slices: 3")}
"""lever -> (its train keys, the worker's line saying it applied them)."""


@pytest.mark.extended  # two runs, about 25 s on 2 cores each lever, like the other levers' runs (test_levers.py):
# make test-all; the equality of gradients is in make test at the model (tests/unit/test_tiled_mlp.py,
# test_tiled_loss.py), the worker's tiled loss in test_recipe_knobs.py
@pytest.mark.parametrize("lever", LEVERS)
def test_tiling_trains_what_the_untiled_model_trains(tmp_path, tiny_model_dir, text_data_file, lever):
    from safetensors.torch import load_file

    keys, line = LEVERS[lever]
    curves, weights, texts = {}, {}, {}
    for name, tiled in (("plain", {}), ("tiled", keys)):
        r = base_recipe(tiny_model_dir, text_data_file, name=f"tile-{name}",
                        peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
                        train={"max_steps": 6, "logging_steps": 1, "gradient_checkpointing": True, **tiled},
                        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
                        output={"dir": str(tmp_path / name), "report_to": ["none"], "loss_curve": False})
        r["data"].pop("eval")
        r["data"]["packing"] = lever == "loss"  # the collator's packed rows reach the loss's slices
        res = ftune("run", str(write_recipe(tmp_path, r, f"{name}.yaml")), cwd=tmp_path)
        assert res.code == 0, res.text[-2000:]
        curves[name], texts[name] = losses(tmp_path / name), res.text
        weights[name] = load_file(tmp_path / name / "final" / "adapter_model.safetensors")
    assert line in texts["tiled"] and line.split(":")[0] not in texts["plain"]
    assert len(curves["plain"]) == 6 and curves["plain"][-1] < curves["plain"][0]
    # the slices' matmuls add up their gradients in another order: equal within float32 rounding
    assert curves["tiled"] == pytest.approx(curves["plain"], rel=1e-5)
    assert len(weights["plain"]) == 28  # q, k, v, o, gate, up, down: A and B, two layers
    assert all(weights["tiled"][k].abs().sum() > 0 for k in weights["plain"] if "lora_B" in k)  # trained from zero
    for key, value in weights["plain"].items():
        assert (weights["tiled"][key] - value).abs().max().item() < 1e-5, key
