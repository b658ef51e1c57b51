"""data.streaming on two real processes (DDP, gloo on CPU, through `ftune run`): each rank reads its own shards of
the stream, the streamed eval set is evaluated, and a run resumed from a checkpoint logs the uninterrupted run's
losses exactly."""

from __future__ import annotations

import json

import pytest

from ftune.rundir import RunDir
from ftune.tiny import corpus
from tests.e2e._util import base_recipe, eval_losses, ftune, metrics, write_recipe

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.extended]

MARKS = ("zqa", "zqb", "zqc", "zqd")  # one word per shard, so a decoded row tells which shard it came from


def _recipe(model_dir, folder, out, resume=None):
    return base_recipe(
        model_dir, folder / "shard-*.jsonl", name="stream2",
        data={"train": [{"path": str(folder / "shard-*.jsonl"), "format": "text"}], "max_seq_length": 48,
              "packing": True, "streaming": True, "eval": [{"path": str(folder / "eval.jsonl"), "limit": 8}]},
        distributed={"strategy": "ddp", "num_processes": 2},
        train={"max_steps": 6, "learning_rate": 5e-3, "per_device_batch_size": 2, "logging_steps": 1, "seed": 3,
               "lr_scheduler": "constant"},
        eval={"strategy": "steps", "steps": 3},
        checkpoint={"strategy": "steps", "steps": 3, "keep": None, "resume": resume or "auto"},
        output={"dir": str(out), "report_to": ["none"], "loss_curve": False},
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("stream2")
    folder = root / "data"
    folder.mkdir()
    texts = corpus(240, seed=9)
    for k, mark in enumerate(MARKS):
        (folder / f"shard-{k}.jsonl").write_text("".join(json.dumps({"text": f"{mark} {t}"}) + "\n"
                                                         for t in texts[k * 50:(k + 1) * 50]))
    (folder / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[200:]))
    env = {"OMP_NUM_THREADS": "1", "FTUNE_RECORD_FACTS": "1"}
    whole = root / "whole"
    res = ftune("run", str(write_recipe(root, _recipe(tiny_model_dir, folder, whole), "whole.yaml")), cwd=root,
                env=env, timeout=600)
    assert res.code == 0, res.text[-3000:]
    resumed = root / "resumed"
    path = write_recipe(root, _recipe(tiny_model_dir, folder, resumed, str(whole / "checkpoints/checkpoint-3")),
                        "resumed.yaml")
    res = ftune("run", str(path), cwd=root, env=env, timeout=600)
    assert res.code == 0, res.text[-3000:]
    return whole, resumed


def test_each_rank_reads_its_own_shards(runs, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    whole, _ = runs
    seen = []
    for rank in (0, 1):
        facts = json.loads(RunDir(whole).rank_facts(rank).read_text())
        assert facts["world_size"] == 2 and facts["ddp"]
        text = " ".join(tok.decode(row) for row in facts["first_batch_ids"])
        seen.append({m for m in MARKS if m in text})
    # accelerate splits the 4 files between the 2 ranks (datasets' shard by node): disjoint, none shared
    assert seen[0] and seen[1] and not seen[0] & seen[1], seen
    assert seen[0] <= {"zqa", "zqb"} and seen[1] <= {"zqc", "zqd"}, seen


def test_streamed_eval_runs_and_a_resumed_run_logs_the_same_losses(runs):
    whole, resumed = runs
    logged = {m["step"]: m["loss"] for m in metrics(whole) if "loss" in m}
    assert sorted(logged) == list(range(1, 7))
    assert len(eval_losses(whole)) == 2 and all(0 < x < 20 for x in eval_losses(whole))  # steps 3 and 6
    again = {m["step"]: m["loss"] for m in metrics(resumed) if "loss" in m}
    assert sorted(again) == [4, 5, 6] and all(again[s] == logged[s] for s in again), (again, logged)
    assert eval_losses(resumed)[-1] == eval_losses(whole)[-1]
