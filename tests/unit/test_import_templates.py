"""`ftune import llama-factory` maps a `template:` to an ftune built-in only where both render the same text: the
same conversations rendered through LLaMA-Factory's formatting (written below from the slots of its published
template definitions, src/llamafactory/data/template.py) and through the built-in the import picks.

LLaMA-Factory builds a row turn by turn: turn 0 opens with `format_prefix` then `format_system` (the row's system,
else the template's `default_system`; a Llama2Template fuses it into the first user turn instead), each user turn
through `format_user`, each answer through `format_assistant`; a ReasoningTemplate (qwen3) puts an empty thought,
`<think>\\n\\n</think>\\n\\n`, before every answer that has none (trained: `enable_thinking` defaults to True)."""

from __future__ import annotations

import pytest

from ftune.chat import builtin
from ftune.datafiles.formats import ChatRenderer
from ftune.importers.llama_factory import NOT_EQUAL, TEMPLATE_NAMES

BOS, EOS = {"bos_token"}, {"eos_token"}
CHATML = dict(user=["<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n"],
              assistant=["{{content}}<|im_end|>\n"], system=["<|im_start|>system\n{{content}}<|im_end|>\n"])
GEMMA = dict(user=["<start_of_turn>user\n{{content}}<end_of_turn>\n<start_of_turn>model\n"],
             assistant=["{{content}}<end_of_turn>\n"], system=["{{content}}\n\n"], prefix=[BOS], fuse=True)
# name -> the slots of LLaMA-Factory's register_template(...) for it
LLAMA_FACTORY = {
    "llama3": dict(user=["<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n"],
                   assistant=["{{content}}<|eot_id|>"],
                   system=["<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>"], prefix=[BOS]),
    "chatml": CHATML,
    "qwen3": {**CHATML, "think": True},
    "qwen3_nothink": CHATML,
    "qwen": {**CHATML, "default_system": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."},
    "gemma": GEMMA, "gemma2": GEMMA, "gemma3": GEMMA,
    "mistral": dict(user=["[INST] {{content}}[/INST]"], assistant=[" {{content}}", EOS], system=["{{content}}\n\n"],
                    prefix=[BOS], fuse=True),
    "phi": dict(user=["<|user|>\n{{content}}<|end|>\n<|assistant|>\n"], assistant=["{{content}}<|end|>\n"],
                system=["<|system|>\n{{content}}<|end|>\n"]),
    "alpaca": dict(user=["### Instruction:\n{{content}}\n\n### Response:\n"], assistant=["{{content}}", EOS, "\n\n"],
                   system=["{{content}}"], default_system="Below is an instruction that describes a task. Write a "
                   "response that appropriately completes the request.\n\n"),
}
THINK = "<think>\n\n</think>\n\n"


def llama_factory(name: str, messages: list[dict], tok) -> str:
    t = LLAMA_FACTORY[name]

    def fill(slots, content: str = "") -> str:
        special = {frozenset(BOS): tok.bos_token or "", frozenset(EOS): tok.eos_token or ""}
        return "".join(s.replace("{{content}}", content) if isinstance(s, str) else special[frozenset(s)]
                       for s in slots)

    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    turns = messages[1:] if messages[0]["role"] == "system" else messages
    system = system or t.get("default_system", "")
    text, fused = "", ""
    for i, message in enumerate(turns):
        if i == 0:
            text += fill(t.get("prefix", []))
            if system and t.get("fuse"):
                fused = fill(t["system"], system)
            elif system:
                text += fill(t["system"], system)
        content = message["content"]
        if message["role"] == "user":
            text += fill(t["user"], (fused if i == 0 else "") + content)
        else:
            if t.get("think") and "<think>" not in content and "</think>" not in content:
                content = THINK + content
            text += fill(t["assistant"], content)
    return text


USER, ANSWER = {"role": "user", "content": "add 2 and 3"}, {"role": "assistant", "content": "5"}
ROWS = {
    "one turn": [USER, ANSWER],
    "as_chat instruction row": [{"role": "user", "content": "Add the numbers.\n2 and 3"}, ANSWER],
    "system": [{"role": "system", "content": "be brief"}, USER, ANSWER],
    "multi-turn": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                   {"role": "assistant", "content": "hello"}, USER, ANSWER],
    "multi-turn, no system": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, USER,
                              ANSWER],
    "an answer with its thought": [USER, {"role": "assistant", "content": "<think>\n2+3\n</think>\n\n5"}],
    "padded": [{"role": "user", "content": " add 2 and 3\n"}, {"role": "assistant", "content": "5 "}],
}
# Rows a mapped template renders differently, as docs/import.md and the mapping's comment say: llama3 and gemma trim
# each turn, LLaMA-Factory's alpaca writes a row's own system prompt without the blank line after it.
DIFFER = {("llama3", "padded"), ("gemma", "padded"), ("gemma2", "padded"), ("gemma3", "padded"),
          ("alpaca", "system"), ("alpaca", "multi-turn")}


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tok.bos_token, tok.eos_token = "<s>", "</s>"  # both set: the prefix and alpaca's eos slot are compared too
    return tok


@pytest.mark.parametrize("name", sorted(TEMPLATE_NAMES))
def test_a_mapped_template_renders_the_rows_as_llama_factory_does(tok, name):
    render = ChatRenderer(tok, builtin(TEMPLATE_NAMES[name]))
    for row, messages in ROWS.items():
        ours, theirs = render(messages, False), llama_factory(name, messages, tok)
        if (name, row) in DIFFER:
            assert ours != theirs, f"{name} / {row}: renders alike now; drop it from DIFFER and the docs"
        else:
            assert ours == theirs, f"{name} / {row}"
    assert tok.bos_token in render(ROWS["one turn"], False) or not LLAMA_FACTORY[name].get("prefix")


@pytest.mark.parametrize("name", sorted(NOT_EQUAL))
def test_a_near_miss_is_not_mapped_and_renders_differently(tok, name):
    """qwen and mistral have a built-in of the same family, whose text differs: not mapped (CHANGES BEHAVIOUR)."""
    assert name not in TEMPLATE_NAMES
    render = ChatRenderer(tok, builtin(name))
    assert render(ROWS["one turn"], False) != llama_factory(name, ROWS["one turn"], tok)


def test_the_qwen3_recipe_imports_to_the_qwen3_template_and_exits_0(tmp_path, capsys):
    from ftune.cli.main import main

    config = tmp_path / "qwen3.yaml"
    config.write_text("model_name_or_path: Qwen/Qwen3-4B\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
                      "dataset: d\ntemplate: qwen3_nothink\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dataset_info.json").write_text('{"d": {"file_name": "d.json"}}')
    out = tmp_path / "recipe.yaml"
    assert main(["import", "llama-factory", str(config), "-o", str(out)]) == 0, capsys.readouterr().err
    import yaml

    recipe = yaml.safe_load(out.read_text())
    assert recipe["data"]["chat_template"] == "chatml"
    assert recipe["data"]["train"][0]["as_chat"] is True
    config.write_text(config.read_text().replace("qwen3_nothink", "mistral"))
    out.unlink()
    assert main(["import", "llama-factory", str(config), "-o", str(out)]) == 1  # the template left out
    err = capsys.readouterr().err
    assert "CHANGES BEHAVIOUR, not imported: template: template 'mistral' has no ftune built-in that renders the " \
           "same text (LLaMA-Factory's mistral writes '[INST] question[/INST]'" in err
    assert main(["import", "llama-factory", str(config), "-o", str(out), "--force", "--accept-changes"]) == 0
