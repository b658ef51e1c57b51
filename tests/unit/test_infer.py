"""After training, without training: what a RUN_DIR_OR_RECIPE argument resolves to and its located errors, the
merge refusal for prefix tuning, chat commands, prompt formats, stop tokens, and the generation metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from ftune.errors import FtuneError, UsageError
from ftune.infer import source
from ftune.infer.chat import Quit, Session
from ftune.recipe.rules.core import eval_generate_needs_prompts
from ftune.recipe.schema import Recipe
from ftune.rundir import RunDir, mark_complete
from ftune import generation as g


def _run_dir(tmp_path: Path, peft: dict | None = None, final: bool = True, complete: bool = True) -> Path:
    """A run dir as `ftune run` leaves it (plan.json, final/ with its record), with no weights in it."""
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    recipe = {"name": "unit", "model": {"path": str(tmp_path / "model")},
              "data": {"train": [{"path": str(tmp_path / "train.jsonl"), "format": "instruction"}]},
              "train": {"max_steps": 1}, "output": {"dir": str(tmp_path / "runs" / "unit")}}
    if peft:
        recipe["peft"] = peft
    (tmp_path / "model").mkdir(parents=True, exist_ok=True)  # the base the adapter goes on (never read here)
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    plan = compile_plan(load_recipe(str(tmp_path / "recipe.yaml")), check_inputs=False)
    run = RunDir(Path(plan.run_dir))
    run.root.mkdir(parents=True)
    run.plan.write_text(plan.model_dump_json())
    if final:
        run.final.mkdir()
        (run.final / "ftune.json").write_text(json.dumps({"method": plan.recipe.peft.method, "quantization": None}))
        (run.final / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        if complete:
            mark_complete(run.final, {"tensors": 1})
    return run.root


def _error(fn, *args, **kwargs) -> FtuneError:
    with pytest.raises(FtuneError) as info:
        fn(*args, **kwargs)
    return info.value


# ------------------------------------------------------------------------------ what the argument names
def test_a_run_dir_its_final_and_its_recipe_resolve_to_final(tmp_path):
    root = _run_dir(tmp_path)
    for arg in (root, root / "final", tmp_path / "recipe.yaml"):
        target = source.resolve(str(arg))
        assert target.model_dir == root / "final" and target.is_adapter and not target.is_merged
        assert target.plan.recipe.name == "unit" and target.record["method"] == "lora"


def test_bad_targets_get_located_errors(tmp_path):
    err = _error(source.resolve, str(tmp_path / "missing"))
    assert isinstance(err, UsageError) and "no such file or folder" in err.message
    (tmp_path / "empty").mkdir()
    err = _error(source.resolve, str(tmp_path / "empty"))
    assert "is not a run dir (with plan.json)" in err.message and err.location.file == str(tmp_path / "empty")
    (tmp_path / "empty" / "config.json").write_text("{}")
    assert source.resolve(str(tmp_path / "empty"), allow_model=True).plan is None  # a plain model folder


def test_a_missing_or_incomplete_final_is_named(tmp_path):
    root = _run_dir(tmp_path / "a", final=False)
    err = _error(source.resolve, str(root))
    assert "has no final/ folder: the run did not finish" in err.message and err.location.file == str(root / "final")
    root = _run_dir(tmp_path / "b", complete=False)
    err = _error(source.resolve, str(root))
    assert "is incomplete (no ftune_complete.json)" in err.message


def test_an_unreadable_plan_is_named(tmp_path):
    (tmp_path / "plan.json").write_text('{"not": "a plan"}')
    err = _error(source.resolve, str(tmp_path))
    assert "is not a readable ftune plan" in err.message and err.location.file == str(tmp_path / "plan.json")


def test_a_half_written_merge_is_named(tmp_path):
    root = _run_dir(tmp_path)
    for name in (".merged.partial-7", "merged"):  # a killed merge's folder; a finished name without the marker
        folder = root / name
        folder.mkdir()
        (folder / "ftune.json").write_text(json.dumps({"merged_from": str(root / "final")}))
        err = _error(source.resolve, str(folder), allow_model=True)
        assert "is a half-written merge" in err.message and err.location.file == str(folder)
    mark_complete(root / "merged", {})
    assert source.resolve(str(root / "merged"), allow_model=True).is_merged


@pytest.mark.parametrize(("method", "peft"), [("prefix", {"method": "prefix", "num_virtual_tokens": 4}),
                                              ("llama-adapter", {"method": "llama-adapter", "adapter_len": 4})])
def test_merge_refuses_prefix_and_llama_adapter(tmp_path, capsys, method, peft):
    from ftune.cli.main import main

    root = _run_dir(tmp_path, peft=peft)
    assert main(["merge", str(root)]) == 1
    err = capsys.readouterr().err
    assert f"a {method} adapter can't be merged into its base" in err and "stays an adapter" in err
    assert err.startswith(f"{root / 'final' / 'adapter_config.json'}: error:") and "Traceback" not in err
    assert not (root / "merged").exists() and not list(root.glob(".merged*"))


def test_lora_merges_full_and_freeze_copy_others_cannot():
    merges = {name: Recipe.model_validate({"name": "x", "model": {"path": "m"}, "data": {"train": [{"path": "d"}]},
                                           "peft": {"method": name, **({"trainable": ["x"]} if name == "freeze" else {})}}).peft.merge
              for name in ("lora", "full", "freeze", "prefix", "llama-adapter")}
    assert merges == {"lora": "merge", "full": "copy", "freeze": "copy", "prefix": None, "llama-adapter": None}


# ------------------------------------------------------------------------------ chat commands
def _session() -> Session:
    return Session(loaded=None, system=None)


def test_chat_commands_change_the_session(tmp_path):
    s = _session()
    s.messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert s.command("/set temperature=0.7") == "temperature = 0.7" and s.temperature == 0.7
    assert s.command("/set max_new_tokens=12") and s.max_new_tokens == 12
    s.command(f"/save {tmp_path / 'c.jsonl'}")
    assert s.command("/system be terse").startswith("system prompt set") and s.messages == []
    s.messages += [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    s.command(f"/save {tmp_path / 'c.jsonl'}")
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert rows == [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
                    {"messages": [{"role": "system", "content": "be terse"}, {"role": "user", "content": "a"},
                                  {"role": "assistant", "content": "b"}]}]
    assert s.command("/reset") == "conversation cleared" and s.messages == [] and s.system == "be terse"
    with pytest.raises(Quit):
        s.command("/quit")


@pytest.mark.parametrize(("line", "message"), [("/set temp=1", "/set takes key=value"),
                                               ("/set top_p=2", "out of range"),
                                               ("/set seed=x", "is not a int"),
                                               ("/save", "needs a file name"), ("/bogus", "unknown command /bogus"),
                                               ("/image cat.png", "/image needs a vision-language run")])
def test_bad_chat_commands_are_usage_errors(line, message):
    with pytest.raises(UsageError, match=message):
        _session().command(line)


def test_prompt_rows_become_vision_chat_messages_with_the_command_line_images_first():
    from ftune.infer.image_prompts import as_messages

    assert as_messages("what colour", ["/a.png"]) == [
        {"role": "user", "content": [{"type": "image", "image": "/a.png"}, {"type": "text", "text": "what colour"}]}]
    assert as_messages({"instruction": "name it", "input": "x"}) == [{"role": "user", "content": "name it\n\nx"}]
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                        {"role": "user", "content": [{"type": "image", "image": "b.png"}, {"type": "text", "text": "and?"}]}]}
    out = as_messages(row, ["/a.png"])
    assert out[:2] == row["messages"][:2] and out[2]["content"] == [
        {"type": "image", "image": "/a.png"}, {"type": "image", "image": "b.png"}, {"type": "text", "text": "and?"}]
    assert row["messages"][2]["content"][0] == {"type": "image", "image": "b.png"}  # the row itself is left as it was


def test_image_parts_in_a_prompt_file_need_a_vision_language_run(tmp_path):
    from ftune.cli.generate import read_prompts

    rows = tmp_path / "rows.jsonl"
    row = {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}, {"type": "text", "text": "x"}]}]}
    rows.write_text(json.dumps({"prompt": "plain"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(UsageError, match="message 1's `content` holds") as err:
        read_prompts(str(rows))
    assert err.value.location.line == 2 and "image parts need a vision-language run" in err.value.hint
    assert read_prompts(str(rows), parts=True) == [(1, {"prompt": "plain"}), (2, row)]


# ------------------------------------------------------------------------------ prompts and stop tokens
@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


@pytest.mark.parametrize("template", [None, "Q: {instruction}\n\nA:", 'say "{instruction}" {{now}} =\\'])
def test_instruction_prompts_and_their_chat_template_agree(tok, template):
    fmt = g.PromptFormat("instruction", template)
    expected = (template or g.ALPACA_TEMPLATE_NO_INPUT).format(instruction="add 1 and 2", input="")
    assert g.encode_prompt(fmt, tok, "add 1 and 2") == tok(expected)["input_ids"]
    rendered = tok.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "add 1 and 2"}],
                                       chat_template=g.as_chat_template(fmt), tokenize=False)
    assert rendered == expected


def test_chat_prompts_end_with_the_generation_prompt(tok):
    from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE

    fmt = g.PromptFormat("chat", DEFAULT_CHAT_TEMPLATE)
    ids = g.encode_prompt(fmt, tok, "hello", system="be brief")
    eos = tok.eos_token
    assert tok.decode(ids) == f"<|system|>\nbe brief{eos}\n<|user|>\nhello{eos}\n<|assistant|>\n"
    assert g.stop_token_ids(tok, fmt) == [tok.eos_token_id]


def test_end_of_turn_tokens_the_template_writes_stop_generation(tok):
    tok = tok.__class__.from_pretrained(tok.name_or_path)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>", "<|eot_id|>"]})
    chatml = g.PromptFormat("chat", "{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}")
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|eot_id|>"])
    assert g.stop_token_ids(tok, chatml) == [tok.eos_token_id, im_end]  # eot_id exists but the template never writes it
    assert g.stop_token_ids(tok, g.PromptFormat("text"), extra=[eot]) == [tok.eos_token_id, eot]


# ------------------------------------------------------------------------------ generation metrics
def test_exact_match_and_f1():
    assert g.exact_match(" The  Cat ", "the cat") == 1.0 and g.exact_match("cat", "cats") == 0.0
    assert g.token_f1("the cat sat", "the cat ran") == pytest.approx(2 / 3)
    assert g.token_f1("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert g.token_f1("", "") == 1.0 and g.token_f1("x", "") == 0.0 and g.token_f1("a", "b") == 0.0


def test_eval_pairs_split_prompt_from_the_first_answer():
    i = g.IGNORE
    rows = [{"input_ids": [1, 2, 3, 4, 5, 6], "labels": [i, i, 3, 4, i, 6]},  # chat: first assistant turn only
            {"input_ids": [1, 2], "labels": [1, 2]},                         # train_on: all, no prompt: skipped
            {"input_ids": [7, 8, 9], "labels": [i, 8, 9]}]
    assert g.eval_pairs(rows) == [([1, 2], [3, 4]), ([7], [8, 9])]
    assert g.eval_pairs(rows, limit=1) == [([1, 2], [3, 4])]


def _recipe(**changes) -> Recipe:
    base = {"name": "x", "model": {"path": "m"},
            "data": {"train": [{"path": "d", "format": "instruction"}], "eval": {"split": 0.1}},
            "eval": {"generate": {"max_new_tokens": 8}}}
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return Recipe.model_validate(base)


def test_eval_generate_rule():
    assert list(eval_generate_needs_prompts(_recipe())) == []
    problems = {p.path: p.message for p in eval_generate_needs_prompts(
        _recipe(data={"train": [{"path": "d", "format": "text"}], "eval": None}))}
    assert problems.keys() == {"eval.generate"} and "needs instruction or chat data" in " ".join(problems.values())
    # a source that writes no format: said at the source, where the format goes
    [defaulted] = eval_generate_needs_prompts(_recipe(data={"train": [{"path": "d"}]}))
    assert defaulted.path == "data.train[0]" and "sets no `format`, so it defaulted to text" in defaulted.message
    assert "format: sharegpt" in defaulted.hint


def test_generation_metrics_fit_the_data():
    from ftune.plan.evaluation import generation_metrics

    assert _recipe().eval.generate.metrics is None
    assert generation_metrics(_recipe()) == ["exact_match", "f1"]  # instruction: short, closed answers
    chat = _recipe(data={"train": [{"path": "d", "format": "sharegpt"}]})
    assert generation_metrics(chat) == ["f1"]  # free-form answers: exact match would read 0
    as_chat = _recipe(data={"train": [{"path": "d", "format": "instruction", "as_chat": True}]})
    assert generation_metrics(as_chat) == ["f1"]
    chosen = _recipe(data={"train": [{"path": "d", "format": "chat"}]}, eval={"generate": {"metrics": ["exact_match"]}})
    assert generation_metrics(chosen) == ["exact_match"]
    assert [p.path for p in eval_generate_needs_prompts(_recipe(data={"train_on": "all"}))] == ["data.train_on"]


def test_merge_check_samples_rows_the_run_left_untokenized(tiny_tokenizer_dir):
    """`ftune merge` compares logits on a few of the run's rows: TRL tokenizes prompt and preference rows itself,
    so their text is tokenized here (a GRPO run's merge failed with KeyError 'input_ids')."""
    from transformers import AutoTokenizer

    from ftune.datafiles.sample import row_ids as _row_ids

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    assert _row_ids({"input_ids": [5, 6, 7], "labels": [1]}, tok) == [5, 6, 7]
    expected = tok("Q: cat\nA: sun", add_special_tokens=False)["input_ids"]
    assert _row_ids({"prompt": "Q: cat\nA:", "answer": " sun", "_row": "row 1"}, tok) == expected  # grpo/rloo
    assert _row_ids({"prompt": "Q: cat\nA:", "chosen": " sun", "rejected": " dog"}, tok) == expected  # preference
    assert _row_ids({"prompt": [{"role": "user", "content": "hi"}]}, tok) == []  # no text: fixed texts instead


def test_merge_check_rows_are_read_directly_as_the_data_stage_encodes_them(tmp_path, tiny_tokenizer_dir,
                                                                         instruction_data_file):
    """`ftune merge` reads the eval source's first rows itself (never the whole data stage): each one's token ids are
    those of a row the data stage builds for the same recipe; a split (no eval source) reads the train rows."""
    from transformers import AutoTokenizer

    from ftune.datafiles.sample import first_rows
    from ftune.recipe.schema import Recipe
    from tests.data_stage import build

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(instruction_data_file.read_text().splitlines(keepends=True)[:6]))
    data = {"train": [{"path": str(instruction_data_file), "format": "instruction"}],
            "eval": [{"path": str(evals), "format": "instruction"}], "max_seq_length": 256,
            "cache_dir": str(tmp_path / "cache")}
    recipe = Recipe.model_validate({"name": "t", "model": {"path": "unused"}, "data": data})
    rows, where = first_rows(recipe, tok, 4)
    staged = {tuple(r["input_ids"]) for r in build(recipe, tok, log=lambda _: None).eval}
    assert where == "eval" and len(rows) == 4 and all(tuple(ids) in staged for ids in rows)
    split = recipe.model_copy(update={"data": recipe.data.model_copy(update={"eval": None})})
    assert first_rows(split, tok, 4)[1] == "train"
    hub = Recipe.model_validate({"name": "t", "model": {"path": "unused"},
                                 "data": {"train": [{"path": "org/set", "type": "hub"}]}})
    assert first_rows(hub, tok, 4) == ([], "train")  # nothing local: the merge check uses its fixed texts
