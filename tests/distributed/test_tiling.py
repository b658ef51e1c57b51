"""ALST's tiling levers under two processes through `ftune run`: the tiled MLP (`train.tiled_mlp`) and the tiled
loss (`train.tiled_loss`), with DDP and LoRA and with FSDP2, full fine-tuning and checkpointing, train what one
untiled process trains (the same losses): the tiled modules' gradients reach DDP's and FSDP's reductions once per
step, and under FSDP2 the output head's sharded weight is whole again when backward recomputes a loss slice."""

from __future__ import annotations

import pytest

from tests.distributed.test_runs import FULL, LOSS_RTOL, STEPS, STRATEGIES, recipe
from tests.e2e._util import ftune, losses, write_recipe

pytestmark = [pytest.mark.distributed, pytest.mark.extended]  # about 25 s a case on 2 cores: make test-all

LORA_ALL = {"method": "lora", "r": 4, "alpha": 8, "dropout": 0.0, "target_modules": "all-linear"}


def run(root, model_dir, data_file, name: str, peft: dict, distributed: dict, batch: int, **train) -> list[float]:
    r = recipe(model_dir, data_file, root / name, peft, distributed, batch, checkpoint={"strategy": "no"})
    r["train"].update(train)
    res = ftune("run", str(write_recipe(root, r, f"{name}.yaml")), cwd=root, env={"OMP_NUM_THREADS": "1"},
                timeout=400)
    assert res.code == 0, res.text[-3000:]
    assert ("tiled MLP: 2 decoder MLPs, slices: 3" in res.text) == bool(train.get("tiled_mlp"))
    assert ("tiled loss: the output head and loss in slices: 3" in res.text) == bool(train.get("tiled_loss"))
    return losses(root / name)


LEVERS = {"mlp": {"tiled_mlp": True, "tiled_mlp_shards": 3}, "loss": {"tiled_loss": True, "tiled_loss_shards": 3}}


@pytest.mark.parametrize("lever", LEVERS)
@pytest.mark.parametrize(("kind", "peft"), [("ddp", LORA_ALL), ("fsdp2", FULL)])
def test_tiling_on_two_processes_trains_what_one_untiled_process_trains(tmp_path, tiny_model_dir, text_data_file,
                                                                        kind, peft, lever):
    one = run(tmp_path, tiny_model_dir, text_data_file, "one", peft, {"strategy": "none"}, 4,
              gradient_checkpointing=True)
    two = run(tmp_path, tiny_model_dir, text_data_file, kind, peft, STRATEGIES[kind], 2,
              gradient_checkpointing=True, **LEVERS[lever])
    assert len(one) == STEPS and one[-1] < one[0]
    assert two == pytest.approx(one, rel=LOSS_RTOL)
