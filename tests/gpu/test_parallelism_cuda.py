"""N-D parallelism on CUDA (`distributed.parallelism`, docs/distributed.md#n-d-parallelism): context parallelism
is refused on CPU (torch's ring attention has no rule for the CPU SDPA kernel), so it is tested here; tensor
parallelism over NCCL too. Each needs 2 GPUs (the sizes multiply to the world) and is skipped with fewer; the plan
checks run on 1 GPU. Each run is compared with a one-process run over the same batch (one data-parallel rank)."""

from __future__ import annotations

import json

import pytest

from tests.e2e._util import base_recipe, ftune, losses, write_recipe

torch = pytest.importorskip("torch")
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.skipif(GPUS < 1, reason="needs a CUDA device")]
two_gpus = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices (tp x cp = the world)")

LAYOUTS = {
    "cp2": ({"strategy": "fsdp", "num_processes": 2, "parallelism": {"cp": 2}}, {}),
    "tp2": ({"strategy": "ddp", "num_processes": 2, "parallelism": {"tp": 2}}, {"checkpoint": {"strategy": "no"}}),
}


def _recipe(tmp_path, tiny_model_dir, text_data_file, name, distributed, **extra):
    return base_recipe(tiny_model_dir, text_data_file, name=name,
                       model={"path": str(tiny_model_dir), "dtype": "float32", "attn_implementation": "sdpa"},
                       peft={"method": "full"}, distributed=distributed,
                       data={"train": [{"path": str(text_data_file), "format": "text", "limit": 64}], "eval": None,
                             "max_seq_length": 32},
                       train={"max_steps": 4, "per_device_batch_size": 4, "learning_rate": 1e-2, "logging_steps": 1,
                              "seed": 3, "lr_scheduler": "constant", "mixed_precision": "no"},
                       eval={"strategy": "no"}, output={"dir": str(tmp_path / name), "report_to": ["none"]}, **extra)


def test_cp_plans_on_gpus(tmp_path, tiny_model_dir, text_data_file):
    """The compiler accepts cp on CUDA (planned for 2 GPUs on this one): sdpa, FSDP2, one data-parallel rank."""
    distributed, extra = LAYOUTS["cp2"]
    path = write_recipe(tmp_path, _recipe(tmp_path, tiny_model_dir, text_data_file, "cp2", distributed, **extra))
    res = ftune("plan", str(path), "--gpus", "2", "--format", "json", cwd=tmp_path)
    assert res.code == 0, res.text[-3000:]


@two_gpus
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parallel_run_matches_one_process(layout, tmp_path, tiny_model_dir, text_data_file):
    distributed, extra = LAYOUTS[layout]
    one = write_recipe(tmp_path, _recipe(tmp_path, tiny_model_dir, text_data_file, "one", {"strategy": "none"}),
                       "one.yaml")
    par = write_recipe(tmp_path, _recipe(tmp_path, tiny_model_dir, text_data_file, layout, distributed, **extra),
                       f"{layout}.yaml")
    for path in (one, par):
        res = ftune("run", str(path), cwd=tmp_path, timeout=600)
        assert res.code == 0, res.text[-3000:]
    plan = json.loads((tmp_path / layout / "plan.json").read_text())
    assert plan["device"] == "cuda" and plan["effective_batch_size"] == 4
    # ring attention / split matmuls sum in another order; TF32 matmuls on the GPU: close, not bit-equal
    assert losses(tmp_path / layout) == pytest.approx(losses(tmp_path / "one"), rel=1e-3)
