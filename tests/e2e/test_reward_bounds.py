"""A GRPO run whose reward never returns (issue #37), through `ftune run` on the tiny model: past
`train.rl.reward_timeout` the run ends with exit 3 naming the reward, the row and the limit, after a checkpoint of
the last complete step; a SIGTERM while the reward runs ends it with exit 143 and that checkpoint.

The hanging reward is a plugin (a dist-info on PYTHONPATH, as pip installs one) that scores normally until step
HANG_AT, then writes a marker and spins in C (`re.search` backtracking: no signal reaches it): the test acts on the
marker, never on timing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e._util import base_recipe, write_recipe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(__import__("importlib").util.find_spec("trl") is None,
                                                   reason="needs trl (pip install 'ftune[preference]')")]

BATCH = 4
HANG_AT = 3
"""The step whose rewards hang: steps 1 and 2 complete first."""

PLUGIN = f'''
import os, re
from ftune.plugins import Plugin, RewardPlugin

CALLS = [0]


def make(args):
    def score(sample):
        CALLS[0] += 1
        if CALLS[0] > {BATCH * (HANG_AT - 1)}:
            open(os.environ["HANG_MARKER"], "w").close()
            re.search("(.|.)*ZZZ", "x" * 64)  # C backtracking: runs for ages, deaf to signals
        return float(len(sample.completion) % 2)
    return score


PLUGIN = Plugin(rewards={{"hangs": RewardPlugin("hang_reward:make")}})
'''


@pytest.fixture
def hanging(tmp_path) -> dict:
    (tmp_path / "hang_reward.py").write_text(PLUGIN)
    info = tmp_path / "ftune_hang-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ftune-hang\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[ftune.plugins]\nhang = hang_reward:PLUGIN\n")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"say {w}"}) + "\n"
                                                    for w in ("cat", "dog", "sun", "rain") * 4))
    marker = tmp_path / "hanging"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}",
           "HANG_MARKER": str(marker)}
    return {"folder": tmp_path, "marker": marker, "env": env}


def _start(folder: Path, model: Path, env: dict, timeout_s: float) -> subprocess.Popen:
    recipe = base_recipe(
        model, folder / "prompts.jsonl",
        data={"train": [{"path": str(folder / "prompts.jsonl"), "format": "prompt"}], "eval": None,
              "max_seq_length": None},
        peft={"method": "full"},
        train={"objective": "grpo", "max_steps": 6, "logging_steps": 1, "per_device_batch_size": BATCH,
               "rl": {"rewards": [{"name": "hangs"}], "num_generations": 2, "max_completion_length": 4,
                      "beta": 0.0, "reward_timeout": timeout_s, "completions_sample": 0}},
        eval={"strategy": "no"}, checkpoint={"strategy": "no"},
        output={"dir": "runs/hang", "report_to": ["none"], "loss_curve": False})
    path = write_recipe(folder, recipe)
    return subprocess.Popen([sys.executable, "-m", "ftune.cli.main", "run", str(path)], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _checkpoint(folder: Path) -> Path:
    return folder / "runs/hang/checkpoints" / f"checkpoint-{HANG_AT - 1}"


@pytest.mark.extended  # a GRPO run through `ftune run`: ~70 s on the 2 loaded cores (the unit tests cover the pool)
def test_a_reward_past_its_limit_ends_the_run_with_exit_3_after_a_checkpoint(hanging, tiny_model_dir):
    proc = _start(hanging["folder"], tiny_model_dir, hanging["env"], timeout_s=1)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err
    assert f"reward 'hangs' took longer than its limit of 1 s on data.train[0] row" in err, err
    assert "Traceback" not in err
    assert (_checkpoint(hanging["folder"]) / "ftune_complete.json").is_file(), err
    assert f"saved a complete checkpoint of step {HANG_AT - 1}" in " ".join(err.split()), err


@pytest.mark.extended
def test_sigterm_while_a_reward_hangs_exits_143_with_a_checkpoint(hanging, tiny_model_dir):
    proc = _start(hanging["folder"], tiny_model_dir, hanging["env"], timeout_s=600)
    marker = hanging["marker"]
    while not marker.exists() and proc.poll() is None:
        __import__("time").sleep(0.05)
    assert marker.exists(), proc.communicate()[1]
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert f"stopped by SIGTERM at step {HANG_AT - 1}" in err and "Traceback" not in err
    assert (_checkpoint(hanging["folder"]) / "ftune_complete.json").is_file()
