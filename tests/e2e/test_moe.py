"""A mixture-of-experts model through `ftune run`: LoRA on every expert (`peft.experts: true`) learns, logs the
router's load-balancing loss and the per-expert token share, saves every expert's delta in final/, and
`ftune merge` folds them into the fused tensors, verified expert by expert (a dropped delta fails it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftune.errors import RunError
from tests.e2e._util import base_recipe, ftune, losses, metrics, write_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory, tiny_qwen3_moe_dir, text_data_file) -> Path:
    folder = tmp_path_factory.mktemp("moe")
    recipe = base_recipe(tiny_qwen3_moe_dir, text_data_file, name="moe",
                         model={"path": str(tiny_qwen3_moe_dir), "dtype": "float32", "router_aux_loss_coef": 0.01},
                         data={"train": [{"path": str(text_data_file), "format": "text"}], "max_seq_length": 32},
                         peft={"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0,
                               "target_modules": ["q_proj", "v_proj"], "experts": True},
                         train={"max_steps": 12, "learning_rate": 2e-2, "per_device_batch_size": 8,
                                "logging_steps": 3, "router_collapse": None},
                         eval={"strategy": "no"}, checkpoint={"strategy": "no"},
                         output={"dir": "runs/r", "report_to": ["none"], "loss_curve": False})
    res = ftune("run", str(write_recipe(folder, recipe)), cwd=folder)
    assert res.code == 0, res.text
    return folder / "runs" / "r"


def test_experts_train_and_the_router_is_logged(moe_run):
    curve = losses(moe_run)
    assert len(curve) >= 4 and curve[-1] < curve[0] - 0.1, curve  # measured: 5.98 -> 5.77
    logged = [m for m in metrics(moe_run) if "loss" in m]
    assert all(m["aux_loss"] > 0 for m in logged)  # 2 layers x E * sum(f_i * P_i): about 1 per layer when even
    assert all(len(m["expert_share"]) == 4 and abs(sum(m["expert_share"]) - 2.0) < 1e-3 for m in logged)
    assert all(0.5 <= m["expert_share_max"] <= 1.0 for m in logged)


def test_final_holds_every_experts_delta(moe_run):
    from safetensors.torch import load_file

    tensors = load_file(str(moe_run / "final" / "adapter_model.safetensors"))
    for layer in (0, 1):
        prefix = f"base_model.model.model.layers.{layer}.mlp.experts"
        # the down_proj wrapper holds the gate_up_proj wrapper (peft nests ParamWrappers): both in every layer
        for wrapper in (prefix, f"{prefix}.base_layer"):
            a, b = tensors[f"{wrapper}.lora_A.weight"], tensors[f"{wrapper}.lora_B.weight"]
            assert a.shape[0] == 8 * 4  # rank 8 for each of the 4 experts
            per_expert = b.reshape(b.shape[0], 8, 4).abs().amax(dim=(0, 1))
            assert bool((per_expert > 0).all()), per_expert  # every expert's B moved from its zero init


def test_merge_verifies_every_expert(moe_run, tmp_path):
    from ftune.infer import merge, source

    result = merge.merge(source.resolve(str(moe_run)), out=tmp_path / "merged", dtype="float32")
    assert result.experts_checked == 8 and result.max_diff <= result.tolerance


def test_merge_fails_when_one_experts_delta_is_dropped(moe_run, tmp_path, monkeypatch):
    """A merge that loses expert 1's delta in layer 0 (its rows of lora_A zeroed just before folding) is caught,
    whichever tokens the sample rows route: each expert's output is compared on its own."""
    import torch

    from ftune.infer import merge, source

    fold = merge._fold

    def lossy(unmerged):
        with torch.no_grad():
            for name, module in unmerged.named_modules():
                if name.endswith("layers.0.mlp.experts") and hasattr(module, "lora_A"):
                    module.lora_A["default"].weight[8:16] = 0  # expert 1's rank-8 block
        return fold(unmerged)

    monkeypatch.setattr(merge, "_fold", lossy)
    with pytest.raises(RunError) as err:
        merge.merge(source.resolve(str(moe_run)), out=tmp_path / "merged", dtype="float32")
    assert "expert 1 of model.layers.0.mlp.experts computes differently merged than with the adapter" in \
        err.value.message
    assert not (tmp_path / "merged").exists()
