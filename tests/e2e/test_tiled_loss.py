"""The tiled loss (`train.tiled_loss`) through `ftune run`: the same training as the model's own loss (loss curve and
the adapter's weights), LoRA on every linear layer, packed rows, gradient checkpointing, on CPU."""

from __future__ import annotations

import pytest

from tests.e2e._util import base_recipe, ftune, losses, write_recipe

pytestmark = pytest.mark.slow


@pytest.mark.extended  # two runs, about 25 s on 2 cores, like the tiled MLP's (make test-all); the loss and gradient
# equality is in make test at the model (tests/unit/test_tiled_loss.py), the worker's wiring in test_recipe_knobs.py
def test_tiled_loss_trains_what_the_models_own_loss_trains(tmp_path, tiny_model_dir, text_data_file):
    from safetensors.torch import load_file

    curves, weights, texts = {}, {}, {}
    for name, tiled in (("plain", {}), ("tiled", {"tiled_loss": True, "tiled_loss_shards": 3})):
        r = base_recipe(tiny_model_dir, text_data_file, name=f"loss-{name}",
                        peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
                        train={"max_steps": 6, "logging_steps": 1, "gradient_checkpointing": True, **tiled},
                        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
                        output={"dir": str(tmp_path / name), "report_to": ["none"], "loss_curve": False})
        r["data"].pop("eval")
        r["data"]["packing"] = True
        res = ftune("run", str(write_recipe(tmp_path, r, f"{name}.yaml")), cwd=tmp_path)
        assert res.code == 0, res.text[-2000:]
        curves[name], texts[name] = losses(tmp_path / name), res.text
        weights[name] = load_file(tmp_path / name / "final" / "adapter_model.safetensors")
    assert "tiled loss: the output head and loss in slices: 3" in texts["tiled"] and "tiled loss" not in texts["plain"]
    assert len(curves["plain"]) == 6 and curves["plain"][-1] < curves["plain"][0]
    assert curves["tiled"] == pytest.approx(curves["plain"], rel=1e-5)
    assert len(weights["plain"]) == 28  # q, k, v, o, gate, up, down: A and B, two layers
    for key, value in weights["plain"].items():
        assert (weights["tiled"][key] - value).abs().max().item() < 1e-5, key
