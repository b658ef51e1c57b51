"""The layout shows when code runs: a static check of every import inside `ftune/` (lazy ones included).

Layers, lowest first; a module imports only from its own package or a lower layer:
  0 ftune (version), errors                                    the error vocabulary
  1 plugins, outputs, typed, clock, quiet, hub, patterns       what plugins register; the output policy; text
                                                               checks; durations shown; library noise off; a model
                                                               id in the HF cache (a path or an id); regexes that
                                                               backtrack
  2 models                                                     model knowledge: which config.json (local, cache,
                                                               model.config, the catalog), the meta-device model,
                                                               positions, MoE and vision-language structure
  3 rundir, lifecycle, methods, tiny, chat, adapter,           shared by both sides
    rewards, tools, gguf, fp8, tiled_mlp, tiled_loss
  4 recipe, report, tiny_vision                                the recipe language; a run dir's report page; tiny
                                                               VLMs of more families (over tiny's template)
  5 datafiles, benchmarks                                      data files read lightly: both sides (checks, formats);
                                                               lm-eval task names and the harness run on a model
  6 plan, importers, generation                                decisions before launch; prompts, stop tokens,
                                                               decoding and their metrics (both sides: the end of
                                                               a run, eval, generate, chat)
  7 estimate, datastage                                        what a recipe will cost; the data stage (tokenizer,
                                                               tokenized / packed / cached rows: both sides, the
                                                               worker's and `ftune data`'s)
  8 runtime                                                    a process holding the model, either side: the model
                                                               loaded as the Plan says, the trainers built for it,
                                                               saved tensors read back, a quantized base guarded
  9 launch | worker                                            parent side | child side (the run): never each other
  10 infer                                                     after training: load, merge, eval, chat (over runtime)
  11 cli                                                       the commands
  12 demo                                                      runs the commands
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ftune"
LAYERS = {
    "ftune": 0, "errors": 0,
    "plugins": 1, "outputs": 1, "typed": 1, "clock": 1, "quiet": 1, "hub": 1, "patterns": 1,
    "models": 2,
    "rundir": 3, "lifecycle": 3, "methods": 3, "tiny": 3, "chat": 3, "adapter": 3, "rewards": 3, "gguf": 3,
    "tools": 3, "fp8": 3, "tiled_mlp": 3, "tiled_loss": 3,
    "recipe": 4, "report": 4, "tiny_vision": 4,
    "datafiles": 5, "benchmarks": 5,
    "plan": 6, "importers": 6, "generation": 6,
    "estimate": 7, "datastage": 7,
    "runtime": 8,
    "launch": 9, "worker": 9,
    "infer": 10,
    "cli": 11,
    "demo": 12,
}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    modules = {_name(p): p for p in ROOT.rglob("*.py")}
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from pkg import sub` imports the submodule; `from pkg import name` the package itself
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                         for a in node.names]
            else:
                continue
            edges[mod] |= {n for n in names if n in modules and n != mod}
    return {m: edges[m] for m in modules}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "ftune"


GRAPH = _graph()


def test_every_package_has_a_layer():
    assert {_package(m) for m in GRAPH} <= set(LAYERS), "add new packages to LAYERS (and the docstring)"


def test_no_upward_or_sideways_imports():
    bad = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                 if _package(a) != _package(b) and LAYERS[_package(b)] >= LAYERS[_package(a)])
    assert bad == []


PARENT = {"recipe", "datafiles", "plan", "importers", "estimate", "launch", "cli"}


def test_the_parent_side_never_imports_the_worker():
    """No exceptions: `ftune data` builds the data through `ftune.datastage` (below both sides), `ftune eval` scores a
    trained model through `ftune.infer.evaluate` (after training, like `generate`, `chat` and `merge`)."""
    bad = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                 if _package(a) in PARENT and _package(b) == "worker")
    assert bad == []


def test_the_data_stage_is_below_both_sides():
    """The worker runs the data stage and `ftune data` shows it (and fills the same cache): it imports neither."""
    dataset = {m for m in GRAPH if _package(m) == "datastage"}
    assert "ftune.datastage.tokenizer" in dataset and "ftune.datastage.packing" in dataset
    assert not {b for m in dataset for b in GRAPH[m] if _package(b) in {"worker", "infer", "cli", "launch"}}


def test_generation_is_below_both_sides():
    """Decoding is shared by the worker (the end of a run) and the commands after training: it imports neither."""
    generation = {m for m in GRAPH if _package(m) == "generation"}
    assert generation == {"ftune.generation", "ftune.generation.stops"}
    assert not {b for m in generation for b in GRAPH[m] if _package(b) in {"worker", "infer", "cli", "launch"}}


def test_infer_and_demo_never_import_the_worker():
    """No exceptions: what `eval`, `merge`, `generate`, `chat` and the demo share with the run (the model, the
    trainers, saved tensors, the quantized base, metrics.jsonl) lives below both, in `ftune.runtime` and
    `ftune.rundir`; the worker is the run alone."""
    bad = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                 if _package(a) in {"infer", "demo"} and _package(b) == "worker")
    assert bad == []


def test_the_runtime_is_below_both_sides():
    """The model-holding room is shared by the run and the commands after training: it imports none of them."""
    runtime = {m for m in GRAPH if _package(m) == "runtime"}
    assert {"ftune.runtime.model", "ftune.runtime.train", "ftune.runtime.rl"} <= runtime
    assert not {f"{m} -> {b}" for m in runtime for b in GRAPH[m]
                if _package(b) in {"worker", "infer", "cli", "launch"}}


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_private_modules_stay_inside_their_package():
    def private_owner(module: str) -> str | None:
        parts = module.split(".")
        for i, part in enumerate(parts):
            if part.startswith("_") and not part.startswith("__"):
                return ".".join(parts[:i])
        return None

    bad = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                 if (owner := private_owner(b)) and not (a == owner or a.startswith(owner + ".")))
    assert bad == []


# A module past ~400 lines usually holds two rooms; the importers' mapping tables (one row per foreign key) are
# long by nature. (The schema is a package of section modules, each under the bound.)
LONG_BY_NATURE = {"ftune/importers/axolotl.py", "ftune/importers/torchtune.py", "ftune/importers/llama_factory.py"}


def test_no_module_over_400_lines():
    long = sorted(f"{p.relative_to(ROOT.parent)}: {n}" for p in ROOT.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 400 and str(p.relative_to(ROOT.parent)) not in LONG_BY_NATURE)
    assert long == []
