"""After training, through the real CLI on one tiny LoRA run (and one QLoRA run): generation metrics at the end of
`ftune run` and in `ftune eval`; `ftune merge` verified and loadable without peft; `ftune generate` deterministic
on the adapter, the merged folder and the QLoRA adapter; `ftune chat` driven through stdin; a failed merge
leaves nothing that looks finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, ftune, metrics, write_recipe

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
GENERATE = {"max_new_tokens": 4, "metrics": ["exact_match", "f1"], "max_samples": 20}
PROMPTS = ("add 2 and 3", "add 7 and 1", "add 4 and 4")


def _answer(a: int) -> str:
    """A task a LoRA on the random tiny model learns in 30 steps: a 3-word answer, then stop."""
    return "the cat sat" if a < 5 else "a dog ran"


def cli(*args: str, capsys) -> tuple[int, str]:
    """The real CLI entry point, in this process (the subprocess start-up of each call would cost seconds)."""
    from ftune.cli.main import main

    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out + (out.err if code else "")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir) -> Path:
    import random

    folder = tmp_path_factory.mktemp("lora")
    rng = random.Random(3)
    rows = [(rng.randint(0, 9), rng.randint(0, 9)) for _ in range(200)]
    data = folder / "qa.jsonl"
    data.write_text("".join(json.dumps({"instruction": f"add {a} and {b}", "output": _answer(a)}) + "\n"
                            for a, b in rows))
    recipe = base_recipe(tiny_model_dir, data, name="after",
                         data={"train": [{"path": str(data), "format": "instruction", "template": "{instruction} ="}],
                               "eval": {"split": 0.1}, "max_seq_length": 64},
                         train={"max_steps": 30, "learning_rate": 3e-2},
                         eval={"strategy": "no", "generate": GENERATE},
                         checkpoint={"strategy": "no"},
                         output={"dir": "runs/r", "report_to": ["none"], "loss_curve": False})
    path = write_recipe(folder, recipe)
    res = ftune("run", str(path), cwd=folder)
    assert res.code == 0, res.text
    return folder / "runs" / "r"


@pytest.fixture(scope="module")
def merged(lora_run) -> dict:
    import contextlib
    import io

    from ftune.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["merge", str(lora_run), "--dtype", "float32", "--shard-size", "100KB", "--format", "json"])
    assert code == 0, buf.getvalue()
    return json.loads(buf.getvalue())


def _generate(target: Path, capsys, *extra: str) -> list[dict]:
    args = [a for p in PROMPTS for a in ("--prompt", p)]
    code, out = cli("generate", str(target), *args, "--max-new-tokens", "6", "--format", "json", *extra,
                    capsys=capsys)
    assert code == 0, out
    return json.loads(out)["results"]


def test_generation_metrics_at_the_end_of_the_run_and_in_eval(lora_run, capsys, monkeypatch):
    logged = [m for m in metrics(lora_run) if "eval_exact_match" in m]
    assert len(logged) == 1
    assert logged[0]["eval_generated"] == 20 and logged[0]["eval_stopped"] == 1.0
    assert 0.2 <= logged[0]["eval_exact_match"] <= logged[0]["eval_f1"] <= 1.0  # learned something, measured
    monkeypatch.chdir(lora_run.parents[1])
    code, out = cli("eval", "recipe.yaml", "--format", "json", capsys=capsys)
    assert code == 0, out
    measured = json.loads(out)["metrics"]
    # greedy decoding of the same model on the same prompts: the same answers
    assert measured["eval_exact_match"] == logged[0]["eval_exact_match"]
    assert measured["eval_f1"] == pytest.approx(logged[0]["eval_f1"])
    assert measured["eval_perplexity"] == pytest.approx(2.718281828459045 ** measured["eval_loss"], rel=1e-6)
    assert "epoch" not in measured and "eval_model_preparation_time" not in measured  # bookkeeping, not results
    assert not (lora_run / "eval-tmp").exists()
    rows = [json.loads(line) for line in (lora_run / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and sum(r["scores"]["exact_match"] for r in rows) / 20 == measured["eval_exact_match"]
    code, out = cli("eval", "recipe.yaml", capsys=capsys)
    assert code == 0 and "predictions " in out and out.count("  completion ") == 3, out


def test_merge_is_verified_sharded_and_loads_without_peft(lora_run, merged, tiny_model_dir):
    out = Path(merged["out"])
    assert out == lora_run / "merged" and merged["action"] == "merged" and merged["base"] == "unquantized float32"
    # data.eval is a split (no eval source): the first train rows, read directly, encoded as the run did
    assert merged["max_diff"] <= 1e-4 and merged["sample_source"] == "4 train rows"
    names = set(merged["files"])
    assert {"model.safetensors.index.json", "generation_config.json", "tokenizer.json", "chat_template.jinja"} <= names
    assert sum(n.endswith(".safetensors") for n in names) > 1  # re-sharded at 100KB
    assert (out / "ftune_complete.json").is_file() and not list(lora_run.glob(".merged.partial-*"))

    # plain transformers with peft unimportable: the merged logits equal base + adapter within 1e-4 (float32)
    probe = ("import sys, json, torch; sys.modules['peft'] = None\n"
             "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
             f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}).eval()\n"
             f"t = AutoTokenizer.from_pretrained({str(out)!r})\n"
             "text = t.apply_chat_template([{'role': 'user', 'content': 'add 1 and 2'}], tokenize=False)\n"
             "ids = t(text, return_tensors='pt')['input_ids']\n"
             "print(json.dumps({'text': text, 'ids': ids[0].tolist(), 'logits': m(input_ids=ids).logits[0].tolist(),"
             " 'eos': m.generation_config.eos_token_id}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(lora_run / "final")
    assert found["text"] == "add 1 and 2 ="  # the saved chat template renders the run's instruction prompt
    assert found["eos"] == tok.eos_token_id
    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), lora_run / "final").eval()
    with torch.no_grad():
        expected = ref(input_ids=torch.tensor([found["ids"]])).logits[0]
    assert torch.allclose(torch.tensor(found["logits"]), expected, atol=1e-4, rtol=0)


def test_generate_is_deterministic_and_equal_on_adapter_and_merged(lora_run, merged, capsys):
    first = _generate(lora_run, capsys)
    assert first == _generate(lora_run, capsys)
    assert [r["completion"] for r in first] == [r["completion"] for r in _generate(Path(merged["out"]), capsys)]
    assert all(r["finish_reason"] == "stop" and r["tokens"] < 6 for r in first)  # EOS ends the answer
    assert all(r["completion"] for r in first)
    sampled = _generate(lora_run, capsys, "--temperature", "1.0", "--seed", "11")
    assert sampled == _generate(lora_run, capsys, "--temperature", "1.0", "--seed", "11")


def test_big_model_inference_offloads_to_disk_under_a_memory_cap(lora_run, merged, tmp_path, capsys):
    """accelerate's dispatch (meta init, then load-and-dispatch): a CPU cap below the model's size puts some layers
    on disk; the answers stay the same. An adapter over disk-offloaded layers is refused, with the way out."""
    cap = ("--device-map", "auto", "--max-memory", "cpu=250KB", "--offload-dir", str(tmp_path / "offload"))
    code, out = cli("generate", merged["out"], *[a for p in PROMPTS for a in ("--prompt", p)], "--max-new-tokens", "6",
                    "--format", "json", *cap, capsys=capsys)
    assert code == 0, out
    result = json.loads(out)
    assert "disk: " in result["model"] and "cpu: " in result["model"]
    assert [r["completion"] for r in result["results"]] == [r["completion"] for r in _generate(Path(merged["out"]), capsys)]
    code, out = cli("generate", str(lora_run), "--prompt", "x", *cap[:3], "cpu=150KB", *cap[4:], capsys=capsys)
    assert code == 1 and "the adapter can't be loaded over a base offloaded to disk" in out and "ftune merge" in out


def test_generation_stops_at_a_stop_token(merged):
    """Decoding ends at the first stop token and drops it; else it runs to max_new_tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ftune.generation import generate

    model = AutoModelForCausalLM.from_pretrained(merged["out"]).eval()
    tok = AutoTokenizer.from_pretrained(merged["out"])
    prompt = tok("add 3 and 3 =")["input_ids"]
    [free] = generate(model, tok, [prompt], stop_ids=[tok.eos_token_id], max_new_tokens=8)
    assert free.stopped and len(free.ids) >= 2 and tok.eos_token_id not in free.ids  # EOS ends it, and is dropped
    [cut] = generate(model, tok, [prompt], stop_ids=[free.ids[1]], max_new_tokens=8)
    assert cut.stopped and cut.ids == free.ids[:1]
    [long] = generate(model, tok, [prompt], stop_ids=[tok.eos_token_id], max_new_tokens=1)
    assert not long.stopped and long.ids == free.ids[:1]
    # left-padded batches of prompts of different lengths decode as each prompt alone
    prompts = [tok(t)["input_ids"] for t in ("add 2 and 3 =", "the cat sat on a mat and the dog ran add 7 and 1 =", "x")]
    alone = [generate(model, tok, [p], stop_ids=[tok.eos_token_id], max_new_tokens=6)[0] for p in prompts]
    assert generate(model, tok, prompts, stop_ids=[tok.eos_token_id], max_new_tokens=6, batch_size=3) == alone


def test_chat_session_driven_through_stdin(lora_run, tmp_path, capsys, monkeypatch):
    import io

    saved = tmp_path / "chats.jsonl"
    script = f"add 2 and 3\n/set temperature=abc\n/system be brief\nadd 7 and 1\n/save {saved}\n/quit\nnot read\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))
    code, out = cli("chat", str(lora_run), "--max-new-tokens", "6", capsys=capsys)
    assert code == 0, out
    answers = [line.removeprefix("model> ") for line in out.splitlines() if line.startswith("model> ")]
    assert len(answers) == 2 and all(answers)
    assert "/set temperature: 'abc' is not a float" in out and "not read" not in out
    [row] = [json.loads(line) for line in saved.read_text().splitlines()]
    assert row == {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "add 7 and 1"},
                                {"role": "assistant", "content": answers[1]}]}


def test_a_failed_merge_leaves_nothing_that_looks_finished(lora_run, tmp_path, capsys, monkeypatch):
    from ftune.infer import merge

    out = tmp_path / "m"
    monkeypatch.setattr(merge, "_max_diff", lambda ref, found: (1.0, 1.0))  # the check fails after the files are written
    code, text = cli("merge", str(lora_run), "--out", str(out), "--dtype", "float32", capsys=capsys)
    assert code == 3 and "merge check failed" in text and "Traceback" not in text
    assert list(tmp_path.iterdir()) == []

    # a killed merge leaves its hidden partial folder: named a half-written merge, then cleaned by the next merge
    monkeypatch.undo()
    partial = tmp_path / ".m.partial-12345"
    partial.mkdir()
    (partial / "ftune.json").write_text(json.dumps({"merged_from": str(lora_run / "final")}))
    (partial / "config.json").write_text("{}")
    code, text = cli("generate", str(partial), "--prompt", "hi", capsys=capsys)
    assert code == 1 and "half-written merge" in text and "Traceback" not in text
    code, text = cli("merge", str(lora_run), "--out", str(out), "--dtype", "float32", capsys=capsys)
    assert code == 0, text
    assert "removing .m.partial-12345" in text and sorted(p.name for p in tmp_path.iterdir()) == ["m"]
    code, text = cli("merge", str(lora_run), "--out", str(out), capsys=capsys)
    assert code == 2 and "already exists (a finished merge)" in text


def test_qlora_adapter_merges_into_the_unquantized_base_and_generates(lora_run, tmp_path, capsys):
    """The LoRA run's output recorded as trained on a 4-bit base (the QLoRA training path is tests/e2e/test_qlora.py):
    generate loads it over a freshly quantized base; merge folds it into the base loaded unquantized."""
    import shutil

    pytest.importorskip("bitsandbytes")
    run = tmp_path / "q"
    shutil.copytree(lora_run, run, ignore=shutil.ignore_patterns("merged", ".merged*"))
    record = json.loads((run / "final/ftune.json").read_text())
    record["quantization"] = {"bits": 4, "type": "nf4", "compute_dtype": "float32"}
    (run / "final/ftune.json").write_text(json.dumps(record))
    code, out = cli("merge", str(run), "--dtype", "float32", "--format", "json", capsys=capsys)
    assert code == 0, out
    result = json.loads(out)
    assert result["base"].startswith("unquantized float32 (the run trained on a 4-bit base")
    assert result["max_diff"] <= 1e-4
    quantized = _generate(run, capsys)
    assert len(quantized) == 3 and all(r["finish_reason"] in ("stop", "length") for r in quantized)
    code, out = cli("generate", str(run), "--prompt", "x", "--format", "json", capsys=capsys)
    assert "on a 4-bit base" in json.loads(out)["model"]


def test_a_full_run_is_copied_and_resharded(tmp_path, tiny_model_dir, text_data_file, capsys):
    """A full fine-tune's final/ is already a plain model: merge re-saves it in the dtype asked, re-sharded, verified.
    (The run dir is assembled around the tiny model as final/: `ftune run` writes the same layout.)"""
    import shutil

    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe
    from ftune.rundir import RunDir, mark_complete

    recipe = base_recipe(tiny_model_dir, text_data_file, name="full", peft={"method": "full"},
                         output={"dir": str(tmp_path / "runs" / "full")})
    plan = compile_plan(load_recipe(str(write_recipe(tmp_path, recipe))), check_inputs=False)
    run = RunDir(Path(plan.run_dir))
    shutil.copytree(tiny_model_dir, run.final)
    run.plan.write_text(plan.model_dump_json())
    (run.final / "ftune.json").write_text(json.dumps({"method": "full", "adapter": False, "quantization": None}))
    mark_complete(run.final, {})
    code, out = cli("merge", str(run.root), "--dtype", "bfloat16", "--shard-size", "150KB", "--format", "json",
                    capsys=capsys)
    assert code == 0, out
    result = json.loads(out)
    assert result["action"] == "copied" and result["dtype"] == "bfloat16" and result["max_diff"] == 0.0
    assert sum(f.endswith(".safetensors") for f in result["files"]) > 1
    from transformers import AutoModelForCausalLM

    import torch

    reloaded = AutoModelForCausalLM.from_pretrained(result["out"])
    original = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert next(reloaded.parameters()).dtype == torch.bfloat16
    for (name, a), (_, b) in zip(sorted(reloaded.state_dict().items()), sorted(original.state_dict().items())):
        assert torch.equal(a, b.to(torch.bfloat16)), name
