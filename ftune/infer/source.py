"""What `RUN_DIR_OR_RECIPE` / `RUN_DIR_OR_MODEL` names: a run dir, a recipe, a run's final/, a merged folder,
or (for generation) any HF model folder. Light: no torch; every dead end is a located `FtuneError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ftune import adapter, hub
from ftune.adapter import RECORD
from ftune.errors import FtuneError, Location, UsageError
from ftune.outputs import PARTIAL  # noqa: F401  (a merge writes into `.<name>.partial-<pid>`, then renames it)
from ftune.hub import looks_local
from ftune.rundir import COMPLETE_MARKER, RunDir, is_complete


@dataclass(frozen=True)
class Target:
    """A model to merge or generate with, and the run it came from (when it came from one)."""

    model_dir: Path
    plan: object | None = None
    """The run's `Plan` (None for a model folder ftune did not train)."""
    record: dict = field(default_factory=dict)
    """The folder's ftune.json: method, base_model, quantization (final/), or merged_from, prompt (merged)."""

    @property
    def is_adapter(self) -> bool:
        return adapter.is_adapter(self.model_dir)

    @property
    def is_merged(self) -> bool:
        return "merged_from" in self.record


def _plan(run_root: Path):
    from pydantic import ValidationError

    from ftune.plan.plan import Plan

    path = RunDir(run_root).plan
    try:
        return Plan.load(path)
    except (ValidationError, ValueError, OSError) as err:
        raise FtuneError(f"{path} is not a readable ftune plan: {str(err).splitlines()[0]}",
                         hint="it was written by a different ftune version or edited; run `ftune run RECIPE` again",
                         location=Location(file=str(path))) from err


def _record(folder: Path) -> dict:
    path = folder / RECORD
    return adapter.read_json(path) if path.is_file() else {}


def _final(run: RunDir, plan) -> Target:
    final = run.final
    if not final.is_dir():
        raise FtuneError(f"{run.root} has no final/ folder: the run did not finish",
                         hint="finish it with `ftune run RECIPE` (it resumes from the last checkpoint)",
                         location=Location(file=str(final)))
    if not is_complete(final):
        raise FtuneError(f"{final} is incomplete (no {COMPLETE_MARKER}): its save was interrupted or failed",
                         hint="run `ftune run RECIPE` again to save it; the checkpoints are kept",
                         location=Location(file=str(final)))
    if adapter.is_adapter(final):
        adapter.checked_config(final)  # before anything is loaded: a cut-short config is named, not a traceback
        _base_present(plan, final)
    return Target(final, plan, _record(final))


def _base_present(plan, final: Path) -> None:
    """The base an adapter goes on is where the run found it (else transformers reads the path as a repo id); a
    hub id offline, in the Hugging Face cache (`ftune.hub`: the folder searched, the download command)."""
    base, revision = str(plan.recipe.model.path), plan.recipe.model.revision
    if not looks_local(base) and (problem := hub.missing("model.path", base, revision, "base model")) is not None:
        raise FtuneError(f"the adapter in {final} needs its {problem.message}",
                         hint=f"download it into this cache: `{hub.download_command(base, revision)}`; or pass the "
                         "run's recipe with model.path=LOCAL_FOLDER",
                         location=Location(file=str(final / adapter.ADAPTER_CONFIG)))
    if looks_local(base) and not Path(base).expanduser().exists():
        raise FtuneError(f"the adapter in {final} goes on the base model {base}, which is no longer there (moved or "
                         "deleted)", hint="put the base back at that path, or pass the run's recipe with "
                         "model.path=NEW_PATH (e.g. `ftune merge runs/x/recipe.resolved.yaml model.path=...`)",
                         location=Location(file=str(final / adapter.ADAPTER_CONFIG)))


def _merged(folder: Path) -> Target:
    if PARTIAL in folder.name or not is_complete(folder):
        raise FtuneError(f"{folder} is a half-written merge (no {COMPLETE_MARKER}): the merge was interrupted "
                         "or failed its check", hint="delete it and run `ftune merge RUN_DIR` again",
                         location=Location(file=str(folder)))
    record = _record(folder)
    source = Path(record["merged_from"])
    run_root = source.parent
    plan = _plan(run_root) if RunDir(run_root).plan.is_file() else None
    return Target(folder, plan, record)


def _refuse_non_recipe(arg: str, path: Path, allow_model: bool) -> None:
    """A file given where a recipe is read, recognised by its content: a GGUF model, safetensors weights or any
    binary file is named as what it is (the YAML loader would report a parse error in it)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return  # the loader says why it can't be read
    what = ("a GGUF model file" if head.startswith(b"GGUF") else
            "a safetensors weights file" if path.suffix == ".safetensors" else
            "a binary file" if b"\0" in head else None)
    if what is not None:
        raise UsageError(f"{arg} is {what}, not a recipe",
                         hint="pass a run dir (runs/NAME) or its recipe file"
                         + (", or a model folder" if allow_model else "")
                         + "; to start from a GGUF, set a recipe's model.path to it")


def resolve(arg: str, overrides: list[str] | tuple[str, ...] = (), *, allow_model: bool = False) -> Target:
    """The target `arg` names: a recipe file, a run dir, a run's final/, a merged folder, or (with
    `allow_model`) any HF model folder."""
    path = Path(arg).expanduser()
    if allow_model and not path.exists() and not looks_local(arg):  # a hub id: its snapshot in the HF cache
        if (cached := hub.folder(arg)) is not None:
            return Target(cached)
        if (problem := hub.missing("model", arg)) is not None:
            raise UsageError(problem.message, hint=problem.hint)
    if not path.exists():
        raise UsageError(f"{arg}: no such file or folder",
                         hint="pass a run dir (runs/NAME), its recipe file" + (", or a model folder" if allow_model else ""))
    if path.is_file():
        import os

        from ftune.plan.compile import compile_plan
        from ftune.recipe import load_recipe

        _refuse_non_recipe(arg, path, allow_model)
        loaded = load_recipe(str(path), list(overrides))
        os.environ.update(loaded.secret_env)
        plan = compile_plan(loaded, check_inputs=False, environ={})  # one process: no launcher
        return _final(plan.run, plan)
    if overrides:
        raise UsageError(f"key=value overrides apply to a recipe, but {arg} is a folder",
                         hint="pass the recipe file instead, or drop the overrides")
    path = path.resolve()
    record = _record(path)
    if PARTIAL in path.name or "merged_from" in record:
        return _merged(path)
    if RunDir(path).plan.is_file():
        return _final(RunDir(path), _plan(path))
    if RunDir(path.parent).plan.is_file() and path == RunDir(path.parent).final:
        return _final(RunDir(path.parent), _plan(path.parent))
    if allow_model and (path / "config.json").is_file():
        return Target(path)
    what = "a run dir (with plan.json), a recipe file" + (", a merged folder or a model folder (config.json)"
                                                          if allow_model else " or a run's final/ folder")
    raise FtuneError(f"{path} is not {what}", hint="point at the run dir `ftune run` wrote (output.dir)",
                     location=Location(file=str(path)))
