"""The worker carries out the Plan: a static walk of `ftune/worker/`, the data stage it runs (`ftune/datastage/`) and
the model-holding room below it (`ftune/runtime/`: the model, the trainers) fails on a read of a recipe key the
compiler decides. The worker may read the recipe only for what it describes and the Plan does not restate (the
data's paths, fields and templates, label names, the method's own section, the seed ...): the allow-list below."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "ftune" / "worker"
DATA_STAGE = WORKER.parent / "datastage"  # the data stage the worker runs (below both sides: `ftune data` runs it too)
RUNTIME = WORKER.parent / "runtime"  # the model and the trainers the worker builds (below both sides: `ftune eval` too)

# Recipe keys (and everything under them) the worker may read, and why.
ALLOWED = {
    "name": "the record in final/ftune.json",
    "model.path": "the base named in final/ftune.json (the Plan's model_load loads it)",
    "model.task": "the collator, label columns and the report: what the data means",
    "model.labels": "label names", "model.num_labels": "label count",
    "model.trust_remote_code": "loading the tokenizer", "model.revision": "loading the tokenizer",
    "model.attn_implementation": "the packed collator's attention mask form (the model is loaded by the Plan)",
    "model.tokens": "tokens added to the tokenizer", "model": "passed whole to the tokenizer stage",
    "data.train": "paths, formats, fields", "data.eval": "paths, formats, fields",
    "data.chat_template": "template text", "data.max_seq_length": "truncation and packing length",
    "data.max_prompt_length": "preference prompts", "data.train_on": "label masking",
    "data.shuffle": "row order", "data.num_proc": "preprocessing workers",
    "data.max_dropped_fraction": "data quality gate", "data.model_dump": "the cache key (every data key)",
    "data.streaming": "how the files are read", "data.mix": "how sources interleave",
    "data.mix_stopping": "how sources interleave",
    "data.images": "how vision-chat images are read and resized (what the rows' images are, like their paths)",
    "peft": "the method's own section, given to its inject()",
    "quantization": "the record in final/ftune.json",
    "kbit": "quantization with `bits` (Recipe.kbit): whether k-bit preparation runs, and final/ftune.json's record",
    "qat": "quantization.qat (Recipe.qat): torchao's fake quantization set up as the section says, and the record",
    "train.seed": "seeding", "train.callbacks": "plugin callbacks by name", "train.objective": "the loss family",
    "train.early_stopping": "the callback's settings", "train.activation_offloading": "a context manager",
    "eval.generate": "generation metrics' settings",
    "output.loss_curve": "whether to draw the curve",
    "output.report": "whether to refresh report.html at each log",
    "train.rl": "online RL's reward functions by name, the completions logged, the clipped-completions message",
    "train.router_collapse": "the router-collapse guard's settings",
    "train.precision": "fp8: the linear layers converted before the PEFT method (chosen on the model by ftune.fp8)",
    "distributed.timeout": "named in the error on a collective that did not answer",
    "distributed.strategy": "the CPU FSDP shim", "distributed.fsdp": "the CPU FSDP shim (its version)",
}
# Keys the compiler decides, so a worker read of them is a second decision (the Plan field that holds each).
DECIDED = {
    "data.packing": "plan.data.packing / plan.data.collator",
    "data.cache_dir": "plan.data.cache",
    "train.gradient_checkpointing": "plan.activation_checkpointing",
    "quantization.upcast_non_quantized": "plan.upcast_non_quantized",
    "distributed.num_processes": "plan.world_size", "distributed.num_machines": "plan.world_size",
    "train.per_device_batch_size": "plan.trainer / plan.data.step_samples",
    "train.gradient_accumulation_steps": "plan.trainer / plan.data.step_samples",
    "train.mixed_precision": "plan.mixed_precision",
}


def _chain(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _recipe_key(chain: list[str], aliases: dict[str, str]) -> str | None:
    """The recipe key a chain reads (`recipe.train.seed` -> `train.seed`), through aliases (`data = recipe.data`)."""
    if chain[0] == "recipe":
        rest = chain[1:]
    elif chain[:2] == ["plan", "recipe"]:
        rest = chain[2:]
    elif chain[0] in aliases:
        rest = [*filter(None, [aliases[chain[0]]]), *chain[1:]]
    else:
        return None
    return ".".join(rest)  # "" for the recipe itself


def reads(source: str) -> set[str]:
    """Recipe keys read in `source`; aliases (`data = recipe.data`, `r = plan.recipe`) count in their function."""
    tree = ast.parse(source)
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]
    found: set[str] = set()
    aliased: set[int] = set()  # `data = recipe.data` names a section; the reads are what follows through `data`
    for scope in reversed(scopes):  # functions first: the module's walk skips their alias assignments
        found |= _reads_in(scope, aliased, with_aliases=scope is not tree)
    return found


def _reads_in(scope: ast.AST, aliased: set[int], with_aliases: bool) -> set[str]:
    aliases: dict[str, str] = {}
    for node in ast.walk(scope) if with_aliases else ():
        if isinstance(node, ast.Assign):
            pairs = [(node.targets[0], node.value)]
            if isinstance(node.targets[0], ast.Tuple) and isinstance(node.value, ast.Tuple):
                pairs = list(zip(node.targets[0].elts, node.value.elts))
            for target, value in pairs:
                chain = _chain(value)
                if isinstance(target, ast.Name) and chain and target.id != "recipe":
                    key = _recipe_key(chain, aliases)
                    if key is not None:
                        aliases[target.id] = key
                        aliased.add(id(value))
    outer = {id(n.value) for n in ast.walk(scope) if isinstance(n, ast.Attribute)}
    found = set()
    for node in ast.walk(scope):
        if isinstance(node, ast.Attribute) and id(node) not in outer and id(node) not in aliased:
            chain = _chain(node)
            key = _recipe_key(chain, aliases) if chain else None
            if key:
                found.add(key)
    return found


SECTIONS = {"model", "data", "peft", "quantization", "distributed", "train", "eval", "checkpoint", "output"}


def _under(key: str, keys) -> bool:
    return any(key == a or key.startswith(a + ".") for a in keys)


def _allowed(key: str) -> bool:
    """A key under an allowed one and not decided; a whole section handed on (`recipe.model`) is read where it
    lands (a limit of this walk: a function taking a section under another name is not followed)."""
    return not _under(key, DECIDED) and (key in SECTIONS or _under(key, ALLOWED))


def test_the_walk_sees_reads_through_aliases():
    src = "def f(plan):\n    data = plan.recipe.data\n    t = plan.recipe.train\n    return data.packing, t.seed\n"
    assert reads(src) == {"data.packing", "train.seed"}
    assert reads("def g(recipe):\n    return recipe.train.gradient_checkpointing\n") == {"train.gradient_checkpointing"}


def test_the_worker_reads_no_decided_recipe_key():
    found = {f"{path.relative_to(WORKER.parent.parent)}: {key}"
             for path in sorted([*WORKER.rglob("*.py"), *DATA_STAGE.rglob("*.py"), *RUNTIME.rglob("*.py")])
             for key in reads(path.read_text()) if not _allowed(key)}
    assert found == set(), "read the Plan's decision instead (or allow-list the key, saying why)"


def test_every_decided_key_read_by_the_worker_would_fail():
    for key in DECIDED:
        for src in (f"def f(recipe):\n    return recipe.{key}\n",
                    f"def f(plan):\n    r = plan.recipe\n    return r.{key}\n"):
            assert reads(src) == {key} and not _allowed(key), src
