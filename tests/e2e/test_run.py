"""End to end through `ftune run` (a real accelerate launch subprocess) on tiny models: every method learns,
final/ reloads with plain transformers/peft and reproduces the logged eval loss."""

from __future__ import annotations

import json
import os
from unittest import mock

import pytest

from tests.e2e._util import base_recipe, eval_losses, ftune, losses, metrics, write_recipe

pytestmark = pytest.mark.slow

METHODS = {
    "lora": {"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
    "prefix": {"method": "prefix", "num_virtual_tokens": 8},
    "llama-adapter": {"method": "llama-adapter", "adapter_len": 8},
    "full": {"method": "full"},
    "freeze": {"method": "freeze", "trainable": [r"layers\.1\.", "lm_head"]},
}
LEARNING_RATES = {"full": 2e-3, "freeze": 2e-3, "prefix": 5e-2, "llama-adapter": 5e-2, "lora": 3e-2}
# Minimum relative drop of the train loss over 30 steps from a random-init tiny model: full/freeze reshape the
# output distribution fast; adapters on frozen random weights move it a little, but never zero (flat = broken).
MIN_DROP = {"full": 0.10, "freeze": 0.10, "prefix": 0.01, "llama-adapter": 0.005, "lora": 0.01}


def _reload(final, model_dir, adapter: bool, task: str = "causal-lm"):
    import transformers

    cls = transformers.AutoModelForSequenceClassification if task != "causal-lm" else transformers.AutoModelForCausalLM
    if adapter:
        from peft import PeftModel

        return PeftModel.from_pretrained(cls.from_pretrained(model_dir), str(final))
    return cls.from_pretrained(final)


@pytest.mark.parametrize("method", list(METHODS))
def test_method_learns_saves_and_reloads(method, tmp_path, tiny_model_dir, text_data_file):
    output = {"loss_curve": True}
    if method == "lora":  # the LoRA run also keeps its live report and logs to an offline MLflow (a file store)
        output |= {"report": True, "report_to": ["tensorboard", "mlflow"],
                   "trackers": {"mlflow": {"tracking_uri": (tmp_path / "mlruns").as_uri(), "experiment": "e2e"}}}
    recipe = base_recipe(tiny_model_dir, text_data_file, name=f"e2e-{method}", peft=METHODS[method],
                         train={"learning_rate": LEARNING_RATES[method]}, output=output)
    path = write_recipe(tmp_path, recipe)
    res = ftune("run", str(path), cwd=tmp_path, env={"DISABLE_MLFLOW_INTEGRATION": "FALSE"})
    assert res.code == 0, res.text
    run_dir = tmp_path / "runs" / "e2e"
    if method == "lora":
        _check_report_and_mlflow(run_dir, tmp_path / "mlruns")
    for name in ("recipe.resolved.yaml", "plan.json", "accelerate.yaml", "env.json", "metrics.jsonl",
                 "loss_curve.png", "final/ftune.json", "final/tokenizer.json"):
        assert (run_dir / name).is_file(), name
    assert any(run_dir.glob("checkpoints/checkpoint-*/ftune_complete.json"))
    assert any(run_dir.glob("tensorboard/**/events.out.tfevents.*"))

    train_losses = losses(run_dir)
    assert train_losses[-1] < (1 - MIN_DROP[method]) * train_losses[0], train_losses
    evals = eval_losses(run_dir)
    assert evals[-1] < evals[0] - 1e-3, evals  # eval set is fixed: a flat loss means nothing trained

    # Trainable/total printed and recorded equal peft's own counts on the reloaded model.
    params = json.loads((run_dir / "params.json").read_text())
    assert f"{params['trainable']:,} trainable" in res.out
    adapter = method in ("lora", "prefix", "llama-adapter")
    model = _reload(run_dir / "final", tiny_model_dir, adapter)
    if adapter:
        assert (run_dir / "final" / "adapter_model.safetensors").is_file()
        assert model.get_nb_trainable_parameters()[1] == params["total"]
    else:
        assert sum(p.numel() for p in model.parameters()) == params["total"]
    if method == "freeze":
        assert params["trainable"] < params["total"]

    # The reloaded model reproduces the logged final eval loss.
    res_eval = ftune("eval", str(path), "--format", "json", cwd=tmp_path)
    assert res_eval.code == 0, res_eval.text
    measured = json.loads(res_eval.out)["metrics"]["eval_loss"]
    assert measured == pytest.approx(evals[-1], abs=1e-4)


def _check_report_and_mlflow(run_dir, store):
    """output.report: report.html holds the finished run (every logged loss); MLflow's file store holds every
    metric the run logged, at its step, equal to metrics.jsonl."""
    from mlflow.tracking import MlflowClient

    page = (run_dir / "report.html").read_text()
    data = json.loads(page.split('id="report-data">')[1].split("</script>")[0])
    loss = next(c for c in data["charts"] if c["id"] == "loss")["lines"][0]["points"]
    assert loss == [[m["step"], m["loss"]] for m in metrics(run_dir) if "loss" in m]
    assert 'data-status="finished"' in page
    estimate = json.loads((run_dir / "estimate.json").read_text())  # `ftune plan`'s, recorded for the page
    assert estimate["peak_bytes"] == sum(i["bytes"] for i in estimate["items"] if i["phase"] in ("always", estimate["peak_phase"]))
    assert f"{estimate['peak_bytes'] / 2**30:.2f} GiB per cpu" in page

    with mock.patch.dict(os.environ, {"MLFLOW_ALLOW_FILE_STORE": "true"}):  # what the plan gave the workers
        client = MlflowClient(tracking_uri=store.as_uri())
        [run] = client.search_runs([client.get_experiment_by_name("e2e").experiment_id])
        for key in ("loss", "eval_loss", "learning_rate", "grad_norm"):
            logged = [(m["step"], m[key]) for m in metrics(run_dir) if key in m]
            history = sorted((h.step, h.value) for h in client.get_metric_history(run.info.run_id, key))
            assert history == logged and logged, key


def test_sequence_classification(tmp_path, tiny_cls_model_dir):
    import random

    rng = random.Random(0)
    rows = []
    for _ in range(240):
        positive = rng.random() < 0.5
        words = rng.sample(["good", "great", "fine", "nice"] if positive else ["bad", "awful", "poor", "sad"], 2)
        filler = rng.sample(["the", "cat", "sat", "on", "a", "mat", "dog", "ran"], 3)
        rows.append({"text": " ".join(filler + words), "label": "positive" if positive else "negative"})
    data = tmp_path / "cls.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = base_recipe(
        tiny_cls_model_dir, data, name="e2e-cls",
        model={"path": str(tiny_cls_model_dir), "task": "sequence-classification", "dtype": "float32",
               "labels": ["negative", "positive"]},
        data={"train": [{"path": str(data), "format": "classification"}], "eval": {"split": 0.2},
              "max_seq_length": 32},
        peft={"method": "lora", "r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"],
              "modules_to_save": ["score"]},
        train={"max_steps": 40, "learning_rate": 1e-2},
        eval={"strategy": "steps", "steps": 20},
    )
    res = ftune("run", str(write_recipe(tmp_path, recipe)), cwd=tmp_path)
    assert res.code == 0, res.text
    run_dir = tmp_path / "runs" / "e2e"
    final = [m for m in metrics(run_dir) if "eval_accuracy" in m][-1]
    assert final["eval_accuracy"] >= 0.8
    assert "eval_f1" in final
    losses_ = losses(run_dir)
    assert losses_[-1] < losses_[0]
    model = _reload(run_dir / "final", tiny_cls_model_dir, adapter=True, task="sequence-classification")
    assert model.config.id2label == {0: "negative", 1: "positive"}
