"""`ftune data`: samples with trained/masked runs, a length histogram, counts, fill; errors without tracebacks."""

from __future__ import annotations

import json

import pytest

from ftune.cli.main import main


def write_recipe(tmp_path, model_path, data_yaml: str, extra: str = "") -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"name: t\nmodel:\n  path: {model_path}\n{extra}data:\n{data_yaml}"
        f"  cache_dir: {tmp_path / 'cache'}\ntrain:\n  max_steps: 2\n"
    )
    return str(path)


@pytest.fixture
def instruction_recipe(tmp_path, tiny_tokenizer_dir, instruction_data_file):
    # model.path is a folder with a tokenizer and no weights at all: `ftune data` must not need them.
    data = (f"  train:\n    - path: {instruction_data_file}\n      format: instruction\n"
            "      template: \"Q: {instruction}\\nA: \"\n  max_seq_length: 64\n  packing: true\n"
            "  eval: {split: 0.1}\n")
    return write_recipe(tmp_path, tiny_tokenizer_dir, data)


def test_json_shows_trained_and_masked_runs_and_the_report(instruction_recipe, capsys):
    assert main(["data", instruction_recipe, "--n", "4", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["samples"]) == 4 and out["mechanism"] == "position_ids"
    for s in out["samples"]:
        text = "".join(r["text"] for r in s["runs"])
        assert text.startswith("Q: add ") and "\nA: " in text
        masked, trained = [r["text"] for r in s["runs"] if not r["trained"]], [r for r in s["runs"] if r["trained"]]
        assert masked[0].startswith("Q: add") and len(trained) == 1
        assert trained[0]["text"].endswith("</s>") and trained[0]["text"][:-4].isdigit()
    rep = out["report"]
    assert (rep["rows"], rep["kept"], rep["dropped"], rep["truncated"]) == (200, 200, 0, 0)
    assert (rep["train_samples"], rep["eval_samples"]) == (180, 20)
    assert rep["packing"] and 0.5 < rep["fill"] <= 1 and rep["packed_rows"] < 180
    assert sum(c for _, _, c in rep["histogram"]) == 180


def test_text_output_has_legend_histogram_counts_and_fill(instruction_recipe, capsys):
    assert main(["data", instruction_recipe, "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert "legend: ⟦trained⟧ · masked (-100)" in out  # no terminal here: trained runs are bracketed
    assert "\nA: ⟦" in out and "</s>⟧" in out
    assert out.count("── train sample") == 2 and "sample 1 of the packed row" in out
    assert "token lengths (before truncation)" in out and "█" in out
    assert "0 dropped without a trainable token, 0 truncated at 64" in out
    assert "packed into" in out and "fill 0." in out and "cache " in out
    # An override works as for `ftune run`, and --split eval shows held-out samples.
    assert main(["data", instruction_recipe, "data.packing=false", "--split", "eval", "--n", "1"]) == 0
    out = capsys.readouterr().out
    assert f"── eval sample 1 (data.train[0] row " in out and "packed into" not in out  # the file's row: see below
    # the batching is the compiler's choice for the recipe: flash-attention flattens the packed rows
    assert main(["data", instruction_recipe, "model.attn_implementation=flash_attention_2", "--n", "1"]) == 0
    assert "attention kept per sample by padding_free (one row per micro-batch, no pad tokens)" in capsys.readouterr().out


def test_each_sample_names_its_source_file_and_row(tmp_path, tiny_tokenizer_dir, capsys):
    """Shuffled, mixed from two files and split: each sample shown is the row its label names (#40: a held-out
    sample labelled "row 0" was row 120 of its file)."""
    files = {}
    for name, first, count in (("a.jsonl", 0, 30), ("b.jsonl", 100, 20)):
        files[name] = [{"instruction": f"add {i} and 1", "input": "", "output": f"{i + 1}"}
                       for i in range(first, first + count)]
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in files[name]))
    data = "".join(f"    - path: {tmp_path / name}\n      format: instruction\n      template: \"Q: {{instruction}}\\nA: \"\n"
                   for name in files)
    recipe = write_recipe(tmp_path, tiny_tokenizer_dir, f"  train:\n{data}  max_seq_length: 64\n  eval: {{split: 0.25}}\n")
    for split, n in (("train", 37), ("eval", 13)):
        assert main(["data", recipe, "--split", split, "--n", "50", "--format", "json"]) == 0
        shown = json.loads(capsys.readouterr().out)["samples"]
        assert len(shown) == n
        for s in shown:
            where, _, rest = s["source"].partition(" row ")
            row, _, path = rest.partition(" of ")
            expected = files[path.rsplit("/", 1)[-1]][int(row) - 1]  # 1-based, as data errors name rows
            assert where == f"data.train[{0 if path.endswith('a.jsonl') else 1}]"
            text = "".join(r["text"] for r in s["runs"])
            assert text.startswith(f"Q: {expected['instruction']}\nA: {expected['output']}"), (s["source"], text)
        assert [s["row"] for s in shown] == list(range(n))  # a source row, not the position: rows differ
        assert [int(s["source"].split(" row ")[1].split(" of ")[0]) - 1 for s in shown] != list(range(n))


def test_classification_samples_show_label_names(tmp_path, tiny_tokenizer_dir, capsys):
    data_file = tmp_path / "cls.csv"
    data_file.write_text("text,label\ngood cat,positive\nbad dog,negative\n")
    data = f"  train:\n    - path: {data_file}\n      format: classification\n"
    model = "  task: sequence-classification\n  labels: [negative, positive]\n"
    recipe = write_recipe(tmp_path, tiny_tokenizer_dir, data, model)
    assert main(["data", recipe, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted((s["label"], s["label_name"]) for s in out["samples"]) == [(0, "negative"), (1, "positive")]


def test_bad_data_is_a_clear_error_not_a_traceback(tmp_path, tiny_tokenizer_dir, text_data_file, capsys):
    data = f"  train:\n    - path: {text_data_file}\n      format: chat\n"
    recipe = write_recipe(tmp_path, tiny_tokenizer_dir, data)
    assert main(["data", recipe]) == 1
    err = capsys.readouterr().err  # refused by the compiler's data check, at the source in the recipe
    assert "needs field `messages`" in err and "have: text" in err and f"{recipe}:6:7: error: data.train[0]" in err
    assert "hint:" in err and "Traceback" not in err


def test_missing_tokenizer_is_a_clear_error(tmp_path, text_data_file, capsys):
    data = f"  train:\n    - path: {text_data_file}\n"
    assert main(["data", write_recipe(tmp_path, tmp_path / "no-model", data)]) == 1
    assert "cannot load the tokenizer" in capsys.readouterr().err


def test_chat_training_that_never_trains_a_stop_token_is_warned(tmp_path, tiny_tokenizer_dir, capsys):
    """A chat template that ends assistant turns with nothing: the model would never learn to stop."""
    rows = [{"messages": [{"role": "user", "content": f"add {i} and 1"}, {"role": "assistant", "content": "the cat sat"}]}
            for i in range(20)]
    data_file = tmp_path / "chat.jsonl"
    data_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    no_eos = "{% for m in messages %}{{ m['role'] }}:\\n{{ m['content'] }}\\n{% endfor %}" \
             "{% if add_generation_prompt %}assistant:\\n{% endif %}"
    data = f"  train:\n    - path: {data_file}\n      format: chat\n"
    assert main(["data", write_recipe(tmp_path, tiny_tokenizer_dir, data + f'  chat_template: "{no_eos}"\n'),
                 "--format", "json"]) == 0
    [warning] = json.loads(capsys.readouterr().out)["warnings"]
    assert "20 of 20 trained answers end without a trained stop token (</s>" in warning
    # ftune's default template ends every turn with eos_token: no warning
    assert main(["data", write_recipe(tmp_path, tiny_tokenizer_dir, data), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    assert main(["data", write_recipe(tmp_path, tiny_tokenizer_dir, data + f'  chat_template: "{no_eos}"\n')]) == 0
    assert "WARNING data.train[0]: 20 of 20 trained answers end without a trained stop token" in \
        capsys.readouterr().out.replace("\n", " ")
