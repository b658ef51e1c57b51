"""Tools as data (`train.rl.tools`): the built-in tools' answers and bounds, the tool process's time limit and
errors, the methods TRL reads (signature, docstring), the rules located at the tool's key, and the hermes
template's tool turns."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from ftune.recipe import load_recipe
from ftune.recipe.schema import ToolSpec
from ftune.tools import BUILTIN, CalculatorCall, LookupArgs, LookupCall, RegexExtractArgs, RegexExtractCall
from ftune.tools.builtin import ToolError, evaluate, lookup, read_table, regex_extract
from tests.unit.test_rl import _write, grpo, line_of, problems


# ------------------------------------------------------------------------------------------ the tools
@pytest.mark.parametrize("expression, value", [("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("2 ** 10", 1024),
                                               ("7 / 2", 3.5), ("-3 + +5", 2), ("17 // 5", 3), ("17 % 5", 2),
                                               ("2 ** -1", 0.5), ("1.5e3", 1500.0)])
def test_calculator_reads_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, why", [
    ("__import__('os').system('true')", "Call is not allowed"), ("x + 1", "Name is not allowed"),
    ("'a' * 3", "'a' is not allowed"), ("1 / 0", "division by zero"), ("1 +", "not an arithmetic expression"),
    ("9 ** 9 ** 9", "more than 100 digits"), ("10 ** 100", "more than 100 digits"), ("True + 1", "True is not allowed"),
    ("(-8) ** 0.5", "not a real number"), ("1" * 101, "more than 100 digits"), ("[1, 2]", "List is not allowed"),
])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression, why):
    start = time.process_time()
    with pytest.raises(ToolError, match=why.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expression)
    assert time.process_time() - start < 0.5  # refused before computing, never run


def test_calculator_bounds_the_expression_length():
    with pytest.raises(ToolError, match="longer than 10 characters"):
        evaluate("1 + 1 + 1 + 1", max_length=10)


def test_lookup_reads_each_table_format_and_matches_keys_loosely(tmp_path):
    (tmp_path / "t.json").write_text(json.dumps({"Paris": "France", "n": 3}))
    (tmp_path / "t.jsonl").write_text('{"key": "Paris", "value": "France"}\n')
    (tmp_path / "t.csv").write_text("key,value\nParis,France\n")
    (tmp_path / "t.tsv").write_text("key\tvalue\nParis\tFrance\n")
    for name in ("t.json", "t.jsonl", "t.csv", "t.tsv"):
        assert read_table(str(tmp_path / name))["Paris"] == "France", name
    call = lookup(LookupArgs(path=str(tmp_path / "t.json")))
    assert call(LookupCall(key="  paris "), {}) == "France" and call(LookupCall(key="n"), {}) == "3"
    assert call(LookupCall(key="Rome"), {}) == "no entry for 'Rome'"
    exact = lookup(LookupArgs(path=str(tmp_path / "t.json"), case_sensitive=True))
    assert exact(LookupCall(key="paris"), {}) == "no entry for 'paris'"


def test_lookup_reads_each_rows_own_table():
    call = lookup(LookupArgs(column="table"))
    # a struct column gives every row the file's keys, null where the row has none: those are no entries
    assert call(LookupCall(key="a"), {"table": {"a": "1", "b": None}}) == "1"
    assert call(LookupCall(key="b"), {"table": {"a": "1", "b": None}}) == "no entry for 'b'"
    assert call(LookupCall(key="a"), {"table": '{"a": "2"}'}) == "2"
    assert call(LookupCall(key="a"), {"table": [{"key": "a", "value": 3}]}) == "3"
    with pytest.raises(ToolError, match="holds int, not a table"):
        call(LookupCall(key="a"), {"table": 5})


def test_lookup_takes_one_table_source():
    with pytest.raises(ValueError, match="exactly one of `path`"):
        LookupArgs()
    with pytest.raises(ValueError, match="exactly one of `path`"):
        LookupArgs(path="t.json", column="table")


def test_regex_extract_returns_bounded_matches_and_refuses_backtracking():
    call = regex_extract(RegexExtractArgs(max_matches=2, max_document_chars=30))
    row = {"document": "id=7 id=8 id=9" + " id=1" * 20}
    assert call(RegexExtractCall(pattern=r"id=(\d)"), row) == "7\n8"
    assert call(RegexExtractCall(pattern=r"zzz"), row) == "no match"
    with pytest.raises(ToolError, match="backtrack catastrophically"):
        call(RegexExtractCall(pattern=r"(a+)+b"), row)
    with pytest.raises(ToolError, match="not a regular expression"):
        call(RegexExtractCall(pattern=r"(a"), row)
    with pytest.raises(ToolError, match="no document in `document`"):
        call(RegexExtractCall(pattern=r"a"), {})


# ------------------------------------------------------------------------------------------ the process
def _env(tools: list[dict], timeout: float = 1.0, error_reward: float = -1.0):
    from ftune.runtime.tools import environment_factory

    rl = SimpleNamespace(tools=[ToolSpec(**t) for t in tools], tool_timeout=timeout, tool_error_reward=error_reward)
    cls = environment_factory(SimpleNamespace(recipe=SimpleNamespace(train=SimpleNamespace(rl=rl))))
    return cls


def test_tool_errors_and_timeouts_are_scored_never_raised():
    cls = _env([{"name": "calculator"}, {"name": "regex_extract"}], timeout=1.0)
    try:
        env = cls()
        assert env.reset(prompt=[], document="ab" * 10, other="not kept") is None
        assert env.row == {"document": "ab" * 10}
        assert env.calculator(expression="6 * 7") == "42" and not env.failed and env.get_reward() == 0.0
        assert env.calculator(expr="1").startswith("error: bad arguments (expression: Field required; expr: "
                                                   "unknown argument)")
        assert env.failed and env.get_reward() == -1.0
        env.reset(document="a" * 40 + "!")
        start = time.monotonic()
        # a pattern the backtracking heuristic misses: the call's time limit stops it
        answer = env.regex_extract(pattern=r"(a|aa)*c")
        assert answer == "error: took longer than 1 s (train.rl.tool_timeout)" and env.failed
        assert time.monotonic() - start < 5
        env.reset(document="xyz")
        assert env.regex_extract(pattern="y") == "y" and not env.failed  # the process was started again
        assert [c["name"] for c in env.calls] == ["regex_extract"] and env.calls[0]["result"] == "y"
    finally:
        cls._ftune_pool.close()


def test_the_methods_trl_reads_carry_the_tools_signature():
    from transformers.utils import get_json_schema

    cls = _env([{"name": "lookup", "column": "t"}, {"name": "calculator"}])
    try:
        schema = get_json_schema(cls().lookup)["function"]
        assert schema["name"] == "lookup" and schema["description"] == BUILTIN["lookup"].description
        assert schema["parameters"]["properties"]["key"] == {"type": "string", "description": "The key to look up."}
        assert schema["parameters"]["required"] == ["key"]
        assert "calculator" in dir(cls) and not any(n.startswith("python") for n in dir(cls))
    finally:
        cls._ftune_pool.close()


def test_a_call_trl_could_not_route_is_a_failed_call():
    from ftune.runtime.tools import note_unrouted, zero_failed

    cls = _env([{"name": "calculator"}])
    try:
        envs = [cls(), cls()]
        for e in envs:
            e.reset()
        note_unrouted(envs, [[{"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "reset", "arguments": {}}}]}],
            [{"role": "assistant", "content": "1"}]])
        assert envs[0].failed and not envs[1].failed and envs[0].calls[0]["error"] == "no tool named 'reset'"
        reward = zero_failed(lambda prompts, completions, **kw: [1.0, 1.0])
        assert reward(["p", "p"], ["a", "b"], environments=envs) == [0.0, 1.0]
    finally:
        cls._ftune_pool.close()


# ------------------------------------------------------------------------------------------ the rules
def test_unknown_refused_and_misfit_tools_are_located(tmp_path):
    p = problems(tmp_path, grpo(tools=[{"name": "lookpu"}, {"name": "python"},
                                       {"name": "calculator", "max_digits": "many"}, {"name": "lookup"},
                                       {"name": "calculator"}]), {"chat_template": "hermes"})
    assert "did you mean 'lookup'" in p["train.rl.tools[0].name"].hint
    assert line_of(p["train.rl.tools[0].name"]).endswith("name: lookpu")
    assert "needs a real sandbox" in p["train.rl.tools[1].name"].message
    assert p["train.rl.tools[2].max_digits"].message.startswith("tool 'calculator': ")
    assert "exactly one of `path`" in p["train.rl.tools[3]"].message
    assert "named twice" in p["train.rl.tools[4].name"].message


def test_tool_settings_need_tools_and_a_template_that_writes_calls(tmp_path):
    p = problems(tmp_path, grpo(max_tool_calls=2))
    assert "names no tool" in p["train.rl.max_tool_calls"].message
    p = problems(tmp_path, grpo(tools=[{"name": "calculator"}]), {"chat_template": "chatml"})
    assert "can't write tool calls" in p["data.chat_template"].message and "hermes" in p["data.chat_template"].hint
    p = problems(tmp_path, grpo(tools=[{"name": "calculator"}]))
    assert "data.chat_template is unset" in p["train.rl.tools"].message
    p = problems(tmp_path, {"objective": "rloo", "rl": {"rewards": [{"name": "exact_match"}],
                                                        "tools": [{"name": "calculator"}]}})
    assert "rloo has no `tools` setting" in p["train.rl.tools"].message


def test_a_missing_or_unreadable_lookup_table_is_a_files_problem(tmp_path):
    from ftune.recipe.rules.tools import table_files

    (tmp_path / "bad.json").write_text("[1, 2]")
    found = {}
    for name in ("none.json", "bad.json"):
        loaded = load_recipe(_write(tmp_path, grpo(tools=[{"name": "lookup", "path": str(tmp_path / name)}]),
                                    {"chat_template": "hermes"}))
        found[name] = {p.path: p.message for p in table_files(loaded.recipe)}["train.rl.tools[0].path"]
    assert found["none.json"].startswith("lookup table not found")
    assert "not an object of key: value" in found["bad.json"]


def test_the_plan_bounds_the_tool_loop(tmp_path):
    from tests.unit.test_rl import plan

    p = plan(tmp_path, grpo(tools=[{"name": "calculator"}], max_tool_calls=4), {"chat_template": "hermes"})
    assert p.trainer["max_tool_calling_iterations"] == 4
    assert "max_tool_calling_iterations" not in plan(tmp_path, grpo()).trainer


# ------------------------------------------------------------------------------------------ the template
def test_hermes_renders_tool_turns_that_trl_accepts(tiny_tokenizer_dir):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

    from ftune.chat import builtin
    from ftune.runtime.tools import response_parser

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tok.add_special_tokens({"eos_token": "<|im_end|>"})
    tok.chat_template = builtin("hermes")
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}}
    text = tok.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": "",
                                                                        "tool_calls": [call]},
                                    {"role": "tool", "content": "1"}, {"role": "assistant", "content": "1"}],
                                   tokenize=False)
    assert text == ('<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{"name": "lookup", '
                    '"arguments": {"key": "a"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n1\n'
                    '</tool_response><|im_end|>\n<|im_start|>assistant\n1<|im_end|>\n')
    listed = tok.apply_chat_template([{"role": "user", "content": "q"}], tools=[
        {"type": "function", "function": {"name": "lookup", "parameters": {}}}], tokenize=False)
    assert '<tools>\n{"type": "function", "function": {"name": "lookup"' in listed
    response_parser(tok, "hermes")
    prefix = tok.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True)
    if isinstance(prefix, dict):
        prefix = prefix["input_ids"]
    ids = tok('<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call><|im_end|>',
              add_special_tokens=False)["input_ids"]
    assert parse_response(tok, ids, prefix=prefix)["tool_calls"] == [call]


def test_chat_rows_keep_an_assistants_tool_calls_in_one_form():
    from ftune.datafiles.chat_rows import chat_anomalies, normalize_messages

    fields = SimpleNamespace(messages="messages", role="role", content="content")
    src = SimpleNamespace(spec=SimpleNamespace(fields=fields, roles=None))

    def fail(i, message, hint=None):
        return ValueError(message)

    rows = [{"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"function": {"name": "lookup", "arguments": {"key": "a", "expression": None}}},
                {"name": "calculator", "arguments": '{"expression": "1+1"}'}]},
            {"role": "tool", "content": "1"}]
    msgs = normalize_messages(rows, src, 0, fail)
    assert msgs[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "lookup", "arguments": {"key": "a"}}},
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}}]}
    assert msgs[2] == {"role": "tool", "content": "1"} and "empty_content" not in chat_anomalies(msgs)
    with pytest.raises(ValueError, match="`arguments` is not JSON"):
        normalize_messages([{"role": "assistant", "content": "", "tool_calls": [{"name": "x", "arguments": "{"}]}],
                           src, 0, fail)
    with pytest.raises(ValueError, match="on an assistant message"):
        normalize_messages([{"role": "user", "content": "", "tool_calls": [{"name": "x"}]}], src, 0, fail)
