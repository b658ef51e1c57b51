"""docs/plan.md's "Published setups checked against the plan": the figures it gives for llama-cookbook's 405B QLoRA
and Axolotl's 70B QLoRA + FSDP recipes (tests/data/published/), planned from the bundled catalog, offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftune.cli.main import main

pytestmark = pytest.mark.extended  # two catalog models of 70B and 405B parameters built on the meta device
PUBLISHED = Path(__file__).resolve().parents[1] / "data" / "published"
GiB = 1024**3


def peak(capsys, name: str, memory: str, *overrides: str) -> float:
    code = main(["plan", str(PUBLISHED / name), *overrides, "--gpu-memory", memory, "--format", "json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)["estimate"]["total_bytes"] / GiB


def test_the_cookbooks_405b_defaults_do_not_fit_80gb_and_one_row_per_step_does(capsys):
    assert round(peak(capsys, "llama-cookbook-405b-qlora.yaml", "80GiB"), 2) == 105.56
    assert round(peak(capsys, "llama-cookbook-405b-qlora.yaml", "80GiB", "train.per_device_batch_size=1",
                      "train.gradient_accumulation_steps=4"), 2) == 39.94


def test_axolotls_70b_plans_around_the_published_21gb_with_and_without_the_offload(capsys):
    assert round(peak(capsys, "axolotl-70b-qlora-fsdp.yaml", "24GB"), 2) == 6.18
    assert round(peak(capsys, "axolotl-70b-qlora-fsdp.yaml", "24GB", "distributed.fsdp.cpu_offload=false"), 2) == 25.16
