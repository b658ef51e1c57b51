"""CLI-wide fuzz: for every command, hypothesis draws each option and positional (read from the command's own argparse
parser) from empty, huge, negative, wrong-type values and paths that are a file, a folder, missing, unwritable or
/dev/full, with stdin and stdout open, closed or full. No draw may end in exit 3, "internal error" or a traceback.

In-process calls of `ftune.cli.main.main` (no subprocess), so `FTUNE_FUZZ_EXAMPLES` (default 200) examples per
command stay cheap; `make fuzz` runs more. `run` always gets --dry-run and `eval` no trained run, so nothing trains.
The world the paths point into is a temporary folder (HOME and the working directory too): nothing outside it is
written. `/` is left out of the draws (`validate /` would walk the whole disk); tests/faults/test_output_policy.py
refuses it as an output for every writing command."""

from __future__ import annotations

import argparse
import errno
import io
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftune.cli import main as cli

EXAMPLES = int(os.environ.get("FTUNE_FUZZ_EXAMPLES", "200"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))
PEER = Path(__file__).resolve().parents[1] / "data" / "import" / "axolotl" / "qlora.yml"
COMMANDS = sorted(cli.COMMANDS)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "home").mkdir()
    (root / "dir").mkdir()
    (root / "file.txt").write_text("not yaml: [\n")
    (root / "empty.yaml").write_text("")
    (root / "data.jsonl").write_text('{"text": "hello"}\n{"text": [1, 2]}\n')
    (root / "bad.yaml").write_text("name: x\nmodel: {path: m}\ntrain: {learning_rate: -1}\n")
    # a recipe that loads, on a model folder that isn't there: every command gets past loading and fails early
    (root / "ok.yaml").write_text("name: fz\nmodel: {path: ./no-model}\ndata: {train: [{path: data.jsonl}]}\n"
                                  "train: {max_steps: 1}\noutput: {dir: runs/fz}\n"
                                  "distributed: {strategy: ddp, num_processes: 2}\n")
    ro = root / "ro"
    ro.mkdir()
    (root / "peer.yml").write_text(PEER.read_text())
    return root


def _paths(world: Path) -> list[str]:
    return ["", " ", "missing/x.yaml", str(world / "dir"), str(world / "file.txt"), str(world / "empty.yaml"),
            str(world / "bad.yaml"), str(world / "ok.yaml"), str(world / "data.jsonl"), str(world / "peer.yml"),
            "/dev/full", "/proc/ftune-fuzz/x", str(world / "file.txt" / "below"), str(world / "home"), ".",
            "runs/fz", "x" * 300]


TEXTS = ["", "-", "--", "x" * 5000, "key=value", "train.max_steps=-1", "~model", "a=b=c", "💥", "${env:HOME}"]
NUMBERS = ["0", "-1", "1", "2", "1000000", str(10**30), "1e309", "nan", "-inf"]  # parse as the option's type...
NOT_NUMBERS = ["abc", "1.5", "", "9" * 400]  # ...and do not (argparse's usage error, exit 2)
SIZES = ["80", "5XB", "0GiB", "-1GB", "1e309GB", "10GB", "cpu=1GiB", "0=x", "=", ""]


def _value(action: argparse.Action, world: Path):
    """Mostly values argparse accepts (so the draw reaches the command), sometimes ones it refuses."""
    if action.choices is not None:
        return st.sampled_from([*map(str, action.choices)] * 3 + ["nope"])
    if action.type in (int, float):
        return st.sampled_from([n for n in NUMBERS if action.type is float or "." not in n and "e" not in n
                                and "n" not in n] * 3 + NOT_NUMBERS[:1])
    return st.sampled_from(_paths(world) + TEXTS + SIZES)


def _argv(command: str, world: Path):
    """A strategy for argv: each optional drawn or left out, each positional drawn, a few stray arguments."""
    parser = cli.build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    parts = []
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction) or action.dest in ("debug",):
            continue
        if not action.option_strings:  # a positional
            many = action.nargs in ("*", "+")
            draw = st.lists(_value(action, world), min_size=0 if action.nargs == "*" else 1, max_size=2) if many \
                else _value(action, world).map(lambda v: [v])
            parts.append(draw)
            continue
        flag = action.option_strings[-1]
        if action.nargs == 0:  # store_true
            parts.append(st.sampled_from([[], [flag]]))
        else:
            parts.append(st.one_of(st.just([]), _value(action, world).map(lambda v, f=flag: [f, v])))
    stray = st.sampled_from([[]] * 9 + [["--nope"], ["extra=1"], ["--"]])
    return st.tuples(*parts, stray).map(lambda ps: [command] + [x for p in ps for x in p])


class _Full(io.StringIO):
    """A stdout on a full disk."""

    def write(self, s):
        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        raise OSError(errno.ENOSPC, "No space left on device")


def _streams():
    return st.tuples(st.sampled_from(["open", "closed"]), st.sampled_from(["open", "closed", "full"]))


def _call(argv: list[str], stdin: str, stdout: str, capsys) -> tuple[int, str]:
    old_in, old_out = sys.stdin, sys.stdout
    sys.stdin = io.StringIO("") if stdin == "open" else None
    sys.stdout = {"open": io.StringIO(), "closed": None, "full": _Full()}[stdout]
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse: usage errors exit 2, --help 0
        code = exc.code if isinstance(exc.code, int) else 2
    finally:
        out = sys.stdout.getvalue() if isinstance(sys.stdout, io.StringIO) and stdout == "open" else ""
        sys.stdin, sys.stdout = old_in, old_out
    return code, out + capsys.readouterr().err


@pytest.mark.slow  # ~5 s per command at 200 examples (in-process), most of it the first import of each stack
@pytest.mark.parametrize("command", COMMANDS)
def test_no_draw_ends_in_an_internal_error(command, world, monkeypatch, capsys):
    monkeypatch.chdir(world)
    monkeypatch.setenv("HOME", str(world / "home"))
    monkeypatch.setenv("FTUNE_DATA_CACHE", str(world / "cache"))
    monkeypatch.delenv("FTUNE_DEBUG", raising=False)
    seen: dict[int | str, int] = {}

    @SETTINGS
    @given(argv=_argv(command, world), streams=_streams())
    def one(argv, streams):
        if command == "run":
            argv = [*argv, "--dry-run"]  # never trains
        if command == "eval" and len(argv) > 1:
            argv = [*argv, "--model", str(world / "dir")]  # no trained model: eval fails before loading weights
        code, text = _call(argv, *streams, capsys)
        key = "usage" if code == 2 and "usage: ftune" in text else code  # stopped by argparse, or by the command
        seen[key] = seen.get(key, 0) + 1
        assert code != 3 and "internal error" not in text and "Traceback" not in text, (argv, streams, code, text)

    one()
    assert sum(seen.values()) >= min(EXAMPLES, 50)
    assert sum(n for key, n in seen.items() if key != "usage") >= min(EXAMPLES, 50) // 5, seen  # most reach the command
    print(json.dumps({command: seen}))
