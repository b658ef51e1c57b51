"""The tiled MLP (`train.tiled_mlp`) through `ftune run`: the same training as the untiled MLP (loss curve and the
adapter's weights), with LoRA on every linear layer and gradient checkpointing, on CPU."""

from __future__ import annotations

import pytest

from tests.e2e._util import base_recipe, ftune, losses, write_recipe

pytestmark = pytest.mark.slow


@pytest.mark.extended  # about 25 s on 2 cores, like the other levers' runs (test_levers.py): make test-all
def test_tiled_mlp_trains_what_the_untiled_mlp_trains(tmp_path, tiny_model_dir, text_data_file):
    from safetensors.torch import load_file

    curves, weights, texts = {}, {}, {}
    for name, tiled in (("plain", {}), ("tiled", {"tiled_mlp": True, "tiled_mlp_shards": 3})):
        r = base_recipe(tiny_model_dir, text_data_file, name=f"tile-{name}",
                        peft={"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"},
                        train={"max_steps": 6, "logging_steps": 1, "gradient_checkpointing": True, **tiled},
                        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
                        output={"dir": str(tmp_path / name), "report_to": ["none"], "loss_curve": False})
        r["data"].pop("eval")
        res = ftune("run", str(write_recipe(tmp_path, r, f"{name}.yaml")), cwd=tmp_path)
        assert res.code == 0, res.text[-2000:]
        curves[name], texts[name] = losses(tmp_path / name), res.text
        weights[name] = load_file(tmp_path / name / "final" / "adapter_model.safetensors")
    assert "tiled MLP: 2 decoder MLPs, slices: 3" in texts["tiled"] and "tiled MLP" not in texts["plain"]
    assert len(curves["plain"]) == 6 and curves["plain"][-1] < curves["plain"][0]
    # the slices' matmuls add up their gradients in another order: equal within float32 rounding
    assert curves["tiled"] == pytest.approx(curves["plain"], rel=1e-5)
    mlp = [k for k in weights["plain"] if ".mlp." in k]
    assert len(mlp) == 12  # gate, up, down: A and B, two layers
    assert all(weights["tiled"][k].abs().sum() > 0 for k in mlp if "lora_B" in k)  # trained from zero
    for key, value in weights["plain"].items():
        assert (weights["tiled"][key] - value).abs().max().item() < 1e-5, key
