"""Write the run directory's inputs: recipe.resolved.yaml, plan.json, accelerate.yaml, env.json (node k > 0 of a
multi-node job: under nodes/node<k>/).

Each file is written to a temporary name and renamed, so a crash never leaves a half-written file.
env.json records versions, the git commit and the host — never environment variable values.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import yaml

from ftune.outputs import write_text_atomic
from ftune.recipe import shown_override

PACKAGES = ("ftune", "torch", "transformers", "peft", "accelerate", "datasets", "bitsandbytes", "tokenizers",
            "safetensors", "omegaconf", "pydantic", "rich", "deepspeed")


def _git_commit(cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def environment(recipe_file: str) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "host": platform.node(),
        "packages": versions,
        "git_commit": _git_commit(Path(recipe_file).parent),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "argv": [shown_override(a) for a in sys.argv[1:]],  # `model.hub_token=***`
    }


def write_inputs(plan, resolved_yaml: str, origins: dict[str, str] | None = None, estimate: dict | None = None) -> str:
    """Write the inputs; returns the sha256 of plan.json as written (the worker checks it before reading it).
    For the report: `origins`, each resolved key's origin as `ftune show --origin` prints it (recipe.origins.json);
    `estimate`, `ftune plan`'s memory estimate (estimate.json)."""
    run = plan.run
    node = run.node(plan.machine_rank)  # node k > 0 of a job sharing the run dir: nodes/node<k>/
    node.root.mkdir(parents=True, exist_ok=True)
    plan_text = plan.model_dump_json(indent=2) + "\n"
    write_text_atomic(node.recipe, resolved_yaml)
    write_text_atomic(node.plan, plan_text)
    if origins is not None:
        write_text_atomic(node.origins, json.dumps(origins, indent=1) + "\n")
    if estimate is not None:
        write_text_atomic(node.estimate, json.dumps(estimate, indent=1) + "\n")
    else:  # a previous launch's estimate is not this plan's
        node.estimate.unlink(missing_ok=True)
    write_text_atomic(node.accelerate_config, yaml.safe_dump(plan.launch.accelerate_config, sort_keys=False))
    write_text_atomic(node.env, json.dumps(environment(plan.recipe_file), indent=2) + "\n")
    if plan.machine_rank == 0:
        run.error.unlink(missing_ok=True)
    return hashlib.sha256(plan_text.encode()).hexdigest()
