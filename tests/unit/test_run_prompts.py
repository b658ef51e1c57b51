"""The run's prompt format (`ftune.datafiles.prompts`): decided once before launch from the training data, recorded as
`Plan.prompt`, read by generate, chat, eval, eval.generate and merge (`ftune.generation.prompt_format`) and by the
tokenizer saved in final/. Preference and prompt rows are read: chat messages in their first rows make the run's
prompts chat (TRL and ftune's data stage render them with the chat template); plain strings stay text."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ftune.datafiles.prompts import PLUGIN_STYLE, STYLES, RunPrompts, decide, note, style_of
from ftune.recipe.schema import BUILTIN_FORMATS, Recipe

USER = [{"role": "user", "content": "add 1 and 2"}]
REPLY = [{"role": "assistant", "content": "3"}]


def recipe(*train: dict, objective: str = "sft", **extra) -> Recipe:
    train_section = {"objective": objective, **extra.pop("train", {})}
    if objective in ("grpo", "rloo"):
        train_section.setdefault("rl", {"rewards": [{"name": "exact_match"}]})
    return Recipe.model_validate({"name": "t", "model": {"path": "unused", **extra.pop("model", {})},
                                  "data": {"train": list(train), **extra.pop("data", {})}, "train": train_section})


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_every_builtin_format_says_how_its_prompts_are_rendered():
    assert set(STYLES) == set(BUILTIN_FORMATS)
    assert style_of("a-plugin-format") is PLUGIN_STYLE and PLUGIN_STYLE.kind == "text"
    # the formats whose rows may hold strings or messages name the fields the data stage renders as messages
    assert {f: s.messages for f, s in STYLES.items() if s.messages} == {
        "preference": ("prompt", "chosen", "rejected"), "unpaired-preference": ("prompt", "completion"),
        "prompt": ("prompt",)}


@pytest.mark.parametrize(("source", "expected"), [
    ({"format": "text"}, ("text", None)),
    ({"format": "pretokenized"}, ("text", None)),
    ({"format": "chat"}, ("chat", None)),
    ({"format": "instruction"}, ("instruction", None)),
    ({"format": "instruction", "template": "Q: {instruction}\nA:"}, ("instruction", "Q: {instruction}\nA:")),
    ({"format": "instruction", "as_chat": True}, ("chat", None)),  # rendered as a conversation: chat, not Alpaca
])
def test_the_format_alone_decides_sft_sources(source, expected):
    got = decide(recipe({"path": "not-read.jsonl", **source}))
    assert (got.format, got.template) == expected
    assert got.source == (None if expected[0] == "text" else "data.train[0]")


def test_the_first_templated_source_decides_and_text_sources_are_skipped():
    got = decide(recipe({"path": "a.jsonl", "format": "text"}, {"path": "b.jsonl", "format": "chat"},
                        {"path": "c.jsonl", "format": "instruction"}))
    assert (got.format, got.source, got.reason) == ("chat", "data.train[1]", "data.train[1] is chat data")


def test_image_rows_are_chat():
    for fmt in ("vision-chat", "vision-preference", "vision-prompt"):
        assert STYLES[fmt].kind == "chat"
    got = decide(recipe({"path": "x.jsonl", "format": "vision-prompt"}, objective="grpo",
                        model={"task": "image-text-to-text"}))
    assert got.format == "chat"


def test_conversational_prompt_rows_make_a_grpo_run_chat(tmp_path):
    rows = jsonl(tmp_path / "p.jsonl", [{"prompt": USER, "answer": "3"}])
    got = decide(recipe({"path": rows, "format": "prompt"}, objective="grpo"))
    assert got == RunPrompts(format="chat", source="data.train[0]",
                             reason=f"data.train[0]'s rows hold chat messages (field `prompt`, row 1 of {rows})")


def test_plain_string_prompt_rows_stay_text(tmp_path):
    rows = jsonl(tmp_path / "p.jsonl", [{"prompt": "Q: add 1 and 2\nA:", "answer": "3"}])
    for objective in ("grpo", "rloo"):
        got = decide(recipe({"path": rows, "format": "prompt"}, objective=objective))
        assert (got.format, got.source, got.reason) == ("text", None, "data.train[0] holds plain-string prompts")


def test_tools_keep_string_prompts_as_messages(tmp_path):
    """With train.rl.tools a string prompt becomes one user turn, rendered by TRL with the chat template."""
    rows = jsonl(tmp_path / "p.jsonl", [{"prompt": "code of k1?", "answer": "3"}])
    got = decide(recipe({"path": rows, "format": "prompt"}, objective="grpo",
                        train={"rl": {"rewards": [{"name": "exact_match"}], "tools": [{"name": "calculator"}]}}))
    assert got.format == "chat" and "train.rl.tools" in got.reason


@pytest.mark.parametrize(("fmt", "objective", "row", "field"), [
    ("preference", "dpo", {"prompt": USER, "chosen": REPLY, "rejected": REPLY}, "prompt"),
    # a string prompt with message completions is rendered as a user turn (render_pair): chat too
    ("preference", "dpo", {"prompt": "add 1 and 2", "chosen": REPLY, "rejected": "4"}, "chosen"),
    ("unpaired-preference", "kto", {"prompt": "add 1 and 2", "completion": REPLY, "label": True}, "completion"),
])
def test_conversational_preference_rows_make_the_run_chat(tmp_path, fmt, objective, row, field):
    plain = {"prompt": "p", "chosen": "a", "rejected": "b"} if fmt == "preference" else \
        {"prompt": "p", "completion": "a", "label": False}
    rows = jsonl(tmp_path / "pairs.jsonl", [plain, row])  # the messages in row 2: the first rows are read
    got = decide(recipe({"path": rows, "format": fmt}, objective=objective))
    assert got.format == "chat" and got.reason.endswith(f"(field `{field}`, row 2 of {rows})"), got


def test_mapped_fields_are_read_where_the_recipe_maps_them(tmp_path):
    rows = jsonl(tmp_path / "p.jsonl", [{"question": USER, "prompt": "a decoy string"}])
    got = decide(recipe({"path": rows, "format": "prompt", "fields": {"prompt": "question"}}, objective="grpo"))
    assert got.format == "chat" and "field `question`" in got.reason


def test_a_glob_is_read_at_its_first_file(tmp_path):
    (tmp_path / "shards").mkdir()
    jsonl(tmp_path / "shards" / "a.jsonl", [{"prompt": USER}])
    jsonl(tmp_path / "shards" / "b.jsonl", [{"prompt": "plain"}])
    got = decide(recipe({"path": str(tmp_path / "shards" / "*.jsonl"), "format": "prompt"}, objective="grpo"))
    assert got.format == "chat" and got.reason.endswith(f"row 1 of {tmp_path / 'shards' / 'a.jsonl'})"), got


def test_a_save_to_disk_folder_is_read_at_its_features(tmp_path):
    """No rows are read from Arrow files lightly, but dataset_info.json says which columns hold lists."""
    string = {"dtype": "string", "_type": "Value"}
    for name, prompt in (("messages", {"feature": {"role": string, "content": string}, "_type": "List"}),
                         ("strings", string)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "dataset_info.json").write_text(json.dumps(
            {"features": {"prompt": prompt, "chosen": string, "rejected": string}}))
    chat = decide(recipe({"path": str(tmp_path / "messages"), "format": "preference"}, objective="dpo"))
    text = decide(recipe({"path": str(tmp_path / "strings"), "format": "preference"}, objective="dpo"))
    assert (chat.format, text.format) == ("chat", "text")


def test_an_unreadable_source_is_taken_as_text_and_the_plan_says_so(tmp_path):
    """`ftune plan` without the data on disk (or a hub dataset not in the cache): text, and a note saying why."""
    r = recipe({"path": str(tmp_path / "missing.jsonl"), "format": "preference"}, objective="dpo")
    got = decide(r)
    assert got.format == "text" and "could not be read before launch" in got.reason
    assert note(r, got) == f"prompts after training (generate, chat, eval, merge): text: {got.reason}"
    assert note(recipe({"path": "x.jsonl", "format": "chat"}), decide(recipe({"path": "x.jsonl", "format": "chat"}))) \
        is None  # the format alone says it: nothing to add


# ------------------------------------------------------------------------------ the Plan and the stages
def test_the_plan_records_the_decision_and_notes_it(tmp_path):
    from ftune.plan.compile import compile_plan
    from ftune.recipe import load_recipe

    rows = jsonl(tmp_path / "pairs.jsonl", [{"prompt": USER, "chosen": REPLY, "rejected": [
        {"role": "assistant", "content": "4"}]}] * 4)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "unit", "model": {"path": "m"},  # no model folder: no meta-device model
                                    "data": {"train": [{"path": rows, "format": "preference"}]},
                                    "train": {"objective": "dpo", "max_steps": 2},
                                    "output": {"dir": str(tmp_path / "runs" / "unit")}}))
    plan = compile_plan(load_recipe(str(path)), check_inputs=False)
    assert plan.prompt == decide(plan.recipe) and plan.prompt.format == "chat"
    assert any(n.startswith("prompts after training (generate, chat, eval, merge): chat: data.train[0]'s rows")
               for n in plan.notes), plan.notes
    assert json.loads(plan.model_dump_json())["prompt"]["format"] == "chat"  # plan.json carries it


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir)


def test_the_stages_read_the_plans_decision(tok, tmp_path):
    """`prompt_format` takes the Plan's word (the rows are not read again: the file may be gone by now); a plan
    written before the decision was recorded (prompt None) is decided from its recipe."""
    from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE
    from ftune.generation import PromptFormat, encode_prompt, prompt_format

    gone = recipe({"path": str(tmp_path / "gone.jsonl"), "format": "prompt"}, objective="grpo")
    chat = SimpleNamespace(prompt=RunPrompts(format="chat", source="data.train[0]", reason="r"), recipe=gone)
    fmt = prompt_format(chat, tok)
    assert fmt == PromptFormat("chat", DEFAULT_CHAT_TEMPLATE)  # the tiny tokenizer has none: ftune's, as in training
    assert tok.decode(encode_prompt(fmt, tok, "add 1 and 2")) == tok.apply_chat_template(
        USER, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert prompt_format(SimpleNamespace(prompt=None, recipe=gone), tok) == PromptFormat("text")
    rows = jsonl(tmp_path / "p.jsonl", [{"prompt": USER}])
    old = SimpleNamespace(prompt=None, recipe=recipe({"path": rows, "format": "prompt"}, objective="grpo"))
    assert prompt_format(old, tok).format == "chat"
    instruction = SimpleNamespace(prompt=RunPrompts(format="instruction", template="Q: {instruction}\nA:",
                                                    source="data.train[0]", reason="r"), recipe=gone)
    assert prompt_format(instruction, tok) == PromptFormat("instruction", "Q: {instruction}\nA:")


def test_final_carries_the_template_conversational_rows_were_rendered_with(tiny_tokenizer_dir, tmp_path):
    """The tokenizer saved in final/ (and a merged folder) holds the chat template the prompts were rendered with, so
    plain transformers users prompt the model as it trained; plain-string rows leave it as it was."""
    from ftune.datafiles.formats import DEFAULT_CHAT_TEMPLATE
    from ftune.datastage.tokenizer import load

    r = recipe({"path": str(tmp_path / "gone.jsonl"), "format": "prompt"}, objective="grpo")
    chat = RunPrompts(format="chat", source="data.train[0]", reason="r")
    assert load(str(tiny_tokenizer_dir), r, prompt=chat).chat_template == DEFAULT_CHAT_TEMPLATE
    assert not load(str(tiny_tokenizer_dir), r, prompt=RunPrompts(format="text", reason="r")).chat_template


def test_default_generation_metrics_follow_the_prompt_format():
    from ftune.plan.evaluation import generation_metrics

    def metrics(source: dict) -> list[str]:
        return generation_metrics(recipe({"path": "x.jsonl", **source}, data={"eval": {"split": 0.1}}))

    assert metrics({"format": "instruction"}) == ["exact_match", "f1"]
    assert metrics({"format": "instruction", "as_chat": True}) == ["f1"]  # free-form chat answers: F1 alone
    assert metrics({"format": "chat"}) == ["f1"]


def test_the_report_shows_the_runs_prompt_format(tmp_path):
    """`ftune report`'s plan decisions show the recorded prompt format beside the other decisions."""
    import shutil

    from ftune.report.collect import read_run

    run = tmp_path / "rl"
    shutil.copytree(Path(__file__).resolve().parents[1] / "data" / "report_runs" / "rl", run)
    plan = json.loads((run / "plan.json").read_text())
    assert "prompt" not in plan  # recorded before the decision was: no row, nothing invented
    assert "prompt" not in dict(read_run(run).decisions())
    decided = RunPrompts(format="chat", source="data.train[0]", reason="data.train[0]'s rows hold chat messages")
    (run / "plan.json").write_text(json.dumps({**plan, "prompt": decided.model_dump()}))
    assert json.loads(dict(read_run(run).decisions())["prompt"]) == decided.model_dump()
