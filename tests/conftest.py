"""Shared fixtures: offline environment, isolated HF caches, tiny models built from configs."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from ftune.tiny import corpus

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="ftune-tests-"))

# Set before anything imports transformers/datasets (collection imports test modules).
os.environ.update(
    {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(_SESSION_TMP / "hf_home"),
        "FTUNE_CACHE": str(_SESSION_TMP / "ftune_cache"),
        "FTUNE_MODEL_CACHE": str(_SESSION_TMP / "ftune_models"),  # GGUFs converted once per session
        "TOKENIZERS_PARALLELISM": "false",
        "TMPDIR": str(_SESSION_TMP / "tmp"),
        "WANDB_DISABLED": "true",
        "DISABLE_MLFLOW_INTEGRATION": "TRUE",
    }
)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test workers on a 2-core machine: one compute thread per process (the plan otherwise gives each run all
    # cores, and two runs at once oversubscribe them: measured 145 s -> 82 s for tests/e2e/test_run.py).
    os.environ["OMP_NUM_THREADS"] = "1"
# A launcher's variables (a CI job inside Slurm or a Kubernetes pod) would make every `ftune run` a node of that job
# (ftune.plan.cluster): the suite means the same everywhere, and the cluster tests set them themselves.
for _name in [n for n in os.environ if n.startswith(("PET_", "SLURM_", "OMPI_", "TORCHELASTIC_"))
              or n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                       "MASTER_PORT")]:
    del os.environ[_name]
(_SESSION_TMP / "tmp").mkdir(exist_ok=True)
tempfile.tempdir = None  # re-read TMPDIR: torchelastic_* folders land in our temp dir and are removed

REPO = Path(__file__).resolve().parent.parent

def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir() -> Path:
    from ftune.tiny import train_tokenizer

    folder = _SESSION_TMP / "tiny-tokenizer"
    train_tokenizer(corpus() + ["User: Assistant: System: ### Instruction: ### Response:"], folder, vocab_size=384)
    return folder


@pytest.fixture(scope="session")
def vlm_dir(tiny_tokenizer_dir) -> Path:
    """A tiny LLaVA (CLIP vision tower, projector, 2-layer Llama) with its processor, as a local HF folder."""
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llava

    folder = _SESSION_TMP / "tiny-llava"
    build_tiny_llava(folder, AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
    return folder


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_tokenizer_dir) -> Path:
    """A 2-layer Llama (hidden 64, dims multiples of 32) with its tokenizer, as a local HF folder."""
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama

    folder = _SESSION_TMP / "tiny-llama"
    build_tiny_llama(folder, AutoTokenizer.from_pretrained(tiny_tokenizer_dir))
    return folder


@pytest.fixture(scope="session")
def tiny_cls_model_dir(tiny_tokenizer_dir) -> Path:
    """A 2-layer Llama for sequence classification with labels negative/positive."""
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_llama

    folder = _SESSION_TMP / "tiny-llama-cls"
    build_tiny_llama(folder, AutoTokenizer.from_pretrained(tiny_tokenizer_dir), task="sequence-classification")
    return folder


def _tiny_moe(tokenizer_dir: Path, name: str, **kwargs) -> Path:
    from transformers import AutoTokenizer

    from ftune.tiny import build_tiny_moe

    folder = _SESSION_TMP / name
    if not (folder / "config.json").exists():
        build_tiny_moe(folder, AutoTokenizer.from_pretrained(tokenizer_dir), **kwargs)
    return folder


@pytest.fixture(scope="session")
def tiny_qwen3_moe_dir(tiny_tokenizer_dir) -> Path:
    """A 2-layer Qwen3-MoE (4 experts, 2 per token, fused expert tensors) with its tokenizer."""
    return _tiny_moe(tiny_tokenizer_dir, "tiny-qwen3-moe", arch="qwen3_moe")


@pytest.fixture(scope="session")
def tiny_mixtral_dir(tiny_tokenizer_dir) -> Path:
    """A 2-layer Mixtral (4 experts, 2 per token)."""
    return _tiny_moe(tiny_tokenizer_dir, "tiny-mixtral", arch="mixtral")


@pytest.fixture(scope="session")
def text_data_file() -> Path:
    path = _SESSION_TMP / "data" / "text.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in corpus(200, seed=1)))
    return path


@pytest.fixture(scope="session")
def instruction_data_file() -> Path:
    import random

    rng = random.Random(3)
    path = _SESSION_TMP / "data" / "instruction.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for _ in range(200):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        rows.append({"instruction": f"add {a} and {b}", "input": "", "output": f"{a + b}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
