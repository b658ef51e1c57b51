"""The output policy (ftune/outputs.py), as a table: every command that writes a user-named output x every target it
must refuse. Each case checks the exit code, the message, and that nothing at the target changed. Then the
positive side: --force replaces an output ftune wrote of the same kind, atomically, and nothing else."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from ftune.cli.main import main
from ftune.tiny import CONFIG
from ftune.errors import FtuneError
from ftune.infer.chat import Session
from ftune.rundir import RunDir, mark_complete
from tests.faults._runs import finished_lora_run

PEER = Path(__file__).resolve().parents[1] / "data" / "import" / "axolotl" / "qlora.yml"
RECIPE = """name: mn
model: {path: m}
data: {train: [{path: d.jsonl}]}
distributed: {strategy: fsdp, num_processes: 4}
train: {epochs: 1}
"""


def _snapshot(path: Path) -> object:
    """What is at `path`: a file's bytes, a folder's tree (names and bytes), or None."""
    if path.is_file():
        return path.read_bytes()
    if path.is_dir():
        return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}
    return None


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A home, a working directory, a base model, a finished LoRA run on it, a live run, a user's file and folder."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))  # a tiny Llama, no weights: the compiler checks it
    (model / "model.safetensors").write_bytes(b"weights")
    run = finished_lora_run(tmp_path, model, {"peft_type": "LORA"})
    (run.checkpoints / "checkpoint-1").mkdir(parents=True)
    live = RunDir(tmp_path / "runs" / "live")  # its holder: a live process on this host (pid 1) recorded in the lock
    live.root.mkdir()
    live.marker.write_text("{}")
    live.lock.write_text(json.dumps({"pid": 1, "host": socket.gethostname(), "command": "ftune run",
                                     "started": "2026-01-01T00:00:00+00:00"}))
    (tmp_path / "user.txt").write_text("my notes\n")
    (tmp_path / "userdir").mkdir()
    (tmp_path / "userdir" / "thesis.tex").write_text("years of work\n")
    (work / "r.yaml").write_text(RECIPE)
    return {"tmp": tmp_path, "home": home, "work": work, "model": model, "run": run, "live": live}


# target name -> (path in the world, what the message says)
TARGETS = {
    "root": (lambda w: Path("/"), "filesystem root"),
    "home": (lambda w: w["home"], "home directory"),
    "cwd": (lambda w: w["work"], "working directory"),
    "finished run dir": (lambda w: w["run"].root, "run dir"),
    "live run dir": (lambda w: w["live"].root, "in use by ftune run (pid 1"),
    "inside a live run dir": (lambda w: w["live"].root / "new", "in use by ftune run (pid 1"),
    "final/": (lambda w: w["run"].final, "final of the run dir"),
    "inside final/": (lambda w: w["run"].final / "sub", "inside final of the run dir"),
    "checkpoints/": (lambda w: w["run"].checkpoints, "checkpoints of the run dir"),
    "inside checkpoints/": (lambda w: w["run"].checkpoints / "checkpoint-1", "inside checkpoints of the run dir"),
    "base model": (lambda w: w["model"], "model"),
    "inside the base model": (lambda w: w["model"] / "sub", "model"),
    "a user's file (--force)": (lambda w: w["tmp"] / "user.txt", "user.txt"),
    "a user's folder (--force)": (lambda w: w["tmp"] / "userdir", "userdir"),
    "the input": (None, ("input", "which the run owns")),  # merge's and chat's input is a run's final/
}


def _merge(w, out: Path, capsys) -> tuple[int, str]:
    code = main(["merge", str(w["run"].root), "--out", str(out), "--force"])
    return code, capsys.readouterr().err


def _import(w, out: Path, capsys) -> tuple[int, str]:
    code = main(["import", "axolotl", str(PEER), "-o", str(out), "--force", "--accept-changes"])
    return code, capsys.readouterr().err


def _launch_script(w, out: Path, capsys) -> tuple[int, str]:
    code = main(["launch-script", "slurm", "r.yaml", "--nodes", "2", "-o", str(out), "--force"])
    return code, capsys.readouterr().err


def _export(w, out: Path, capsys) -> tuple[int, str]:
    code = main(["export", "gguf", str(w["run"].root), "--out", str(out), "--force"])
    return code, capsys.readouterr().err


def _report(w, out: Path, capsys) -> tuple[int, str]:
    code = main(["report", str(w["run"].root), "--out", str(out), "--force"])
    return code, capsys.readouterr().err


def _chat_save(w, out: Path, capsys) -> tuple[int, str]:
    session = Session(loaded=None, inputs=(w["run"].final,))
    session.messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    try:
        return 0, session.command(f"/save {out}")
    except FtuneError as err:
        return err.exit_code, err.render()


COMMANDS = {  # command -> (runner, its input)
    "merge --out": (_merge, lambda w: w["run"].final),
    "import -o": (_import, lambda w: PEER),
    "launch-script -o": (_launch_script, lambda w: w["work"] / "r.yaml"),
    "chat /save": (_chat_save, lambda w: w["run"].final),
    "export gguf --out": (_export, lambda w: w["run"].final),
    "report --out": (_report, lambda w: w["run"].plan),  # its input is the run dir: its files are the run's
}


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_writing_command_refuses_every_forbidden_target(world, command, target, capsys):
    runner, given = COMMANDS[command]
    where, says = TARGETS[target]
    path = given(world) if where is None else where(world)
    before = _snapshot(path) if path != Path("/") else None
    code, text = runner(world, path, capsys)
    assert code == (5 if "live" in target else code) and code in ((5,) if "live" in target else (1, 2)), text
    assert any(s in text for s in ((says,) if isinstance(says, str) else says)), text
    assert "Traceback" not in text and "internal error" not in text, text
    assert str(path) in text  # located at the path refused
    if path != Path("/"):
        assert _snapshot(path) == before  # nothing there changed
    assert not list(path.parent.glob(f".{path.name}*")) or path == Path("/")  # no temporary sibling left


def test_force_replaces_only_what_ftune_wrote_of_the_same_kind(world, capsys):
    out = world["tmp"] / "imported.yaml"
    assert main(["import", "axolotl", str(PEER), "-o", str(out), "--accept-changes"]) == 0
    first = out.read_text()
    assert main(["import", "axolotl", str(PEER), "-o", str(out), "--accept-changes"]) == 2  # exists: no --force
    assert "already exists (a recipe `ftune import` wrote)" in capsys.readouterr().err
    out.write_text(first + "# my edit\n")
    assert main(["import", "axolotl", str(PEER), "-o", str(out), "--force", "--accept-changes"]) == 0  # ours: replaced
    assert out.read_text() == first and not list(out.parent.glob(".imported.yaml.tmp*"))
    script = world["tmp"] / "job.sbatch"
    assert main(["launch-script", "slurm", "r.yaml", "--nodes", "2", "-o", str(script)]) == 0
    # an imported recipe is not a launch script: --force does not replace one kind with another
    assert main(["launch-script", "slurm", "r.yaml", "--nodes", "2", "-o", str(out), "--force"]) == 1
    assert "is not a script `ftune launch-script` wrote" in capsys.readouterr().err and out.read_text() == first
    assert main(["launch-script", "slurm", "r.yaml", "--nodes", "3", "-o", str(script), "--force"]) == 0
    assert "--nodes=3" in script.read_text() and os.access(script, os.X_OK)


def test_merge_output_policy_accepts_the_default_and_a_finished_merge_with_force(world):
    from ftune.infer.merge import check_out
    from ftune.infer.source import resolve

    target = resolve(str(world["run"].root))
    assert check_out(target, None, force=False) == world["run"].merged  # <run>/merged: a new name in the run dir
    done = world["run"].merged
    done.mkdir()
    (done / "ftune.json").write_text(json.dumps({"merged_from": str(world["run"].final)}))
    mark_complete(done, {})
    with pytest.raises(FtuneError, match="already exists \\(a finished merge\\)"):
        check_out(target, None, force=False)
    assert check_out(target, None, force=True) == done
    other = world["tmp"] / "other"  # a complete folder that is not a merge, outside the run dir
    other.mkdir()
    (other / "ftune.json").write_text(json.dumps({"other": 1}))
    mark_complete(other, {})
    with pytest.raises(FtuneError, match="is not a finished merge; --force replaces only that"):
        check_out(target, other, force=True)


def test_chat_save_appends_to_its_own_log_only(world):
    session = Session(loaded=None, inputs=(world["run"].final,))
    session.messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    log = world["tmp"] / "chats" / "c.jsonl"
    session.command(f"/save {log}")
    session.command(f"/save {log}")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["messages"][1]["content"] == "hello"
    for where, says, code in ((world["tmp"] / "user.txt" / "c.jsonl", "user.txt is not a folder", 2),
                              (Path("/dev/full"), "not a regular file", 2),
                              (Path("/proc/ftune-nope/c.jsonl"), "can't write", 2),
                              (world["tmp"] / "chats", "is a folder", 2)):
        with pytest.raises(FtuneError) as info:
            session.command(f"/save {where}")
        assert says in info.value.message and info.value.exit_code == code, info.value.render()
    assert len(log.read_text().splitlines()) == 2  # the conversation is still there to save elsewhere
