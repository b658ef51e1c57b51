"""`ftune validate PATH...`: check recipes without the model or the data, every problem at once.

Directories are walked for *.yaml / *.yml; a file that only serves as a base (another recipe in the
walk extends it) is checked through the recipes that extend it, not alone. Exit codes: 0 all valid,
1 any invalid, 2 usage or I/O error. Nothing heavy is imported: this is a CI gate.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ftune.errors import EXIT_INVALID, EXIT_OK, EXIT_USAGE, Location, Problem, RecipeError, UsageError

_HIDDEN = re.compile(r"(^|/)\.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="recipe files, or directories to walk for *.yaml")
    parser.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default="text",
        help="text (compiler style), json (one object), github (workflow annotations)",
    )
    parser.add_argument(
        "--check-paths",
        action="store_true",
        help="also check the files the recipe names: local model, tokenizer, data and config paths exist (offline: "
             "hub ids in the Hugging Face cache), the data files' first rows, the model folder, reward models",
    )


@dataclass
class Report:
    file: str
    problems: list[Problem] = field(default_factory=list)
    unreadable: bool = False  # an I/O problem with the file itself: exit 2

    @property
    def valid(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    def as_json(self) -> dict:
        keys = ("file", "line", "column", "path", "message", "hint")
        errors = [{k: v for k, v in p.as_json().items() if k in keys} for p in self.problems]
        return {"file": self.file, "valid": self.valid, "errors": errors}


def _walk(folder: Path) -> tuple[list[Path], list[Path]]:
    """(YAML files under `folder`, those inside ftune run dirs: a folder holding ftune_run.json is a run's output,
    whose recipe copy and configs are not the recipes under check)."""
    from ftune.rundir import RUN_MARKER

    files = sorted(
        f
        for f in folder.rglob("*")
        if f.suffix in (".yaml", ".yml") and f.is_file() and not _HIDDEN.search(f.relative_to(folder).as_posix())
    )
    runs = {m.parent for m in folder.rglob(RUN_MARKER)}
    in_runs = [f for f in files if any(r == f.parent or r in f.parents for r in runs)]
    return [f for f in files if f not in in_runs], in_runs


@dataclass
class Skipped:
    """Walked files that are not checked as recipes, by why."""

    bases: list[Path]
    """Bases, checked through the recipes that extend them."""
    configs: list[Path]
    """accelerate / DeepSpeed config files that recipes name."""
    runs: list[Path]
    """Files inside ftune run dirs."""


def collect(paths: list[str]) -> tuple[list[Path], Skipped]:
    """(recipe files to check, walked files left out): bases of walked directories are checked through the recipes
    that extend them; config files recipes name (distributed.accelerate_config, distributed.deepspeed.config) and
    run dirs are not recipes; a file named on the command line is always checked."""
    from ftune.recipe.load import named_config_files, recipe_bases

    explicit: list[Path] = []
    walked: list[Path] = []
    runs: list[Path] = []
    for arg in paths:
        p = Path(arg)
        if p.is_dir():
            found, in_runs = _walk(p)
            runs += in_runs
            if not found and not in_runs:
                raise UsageError(f"no recipe files (*.yaml, *.yml) under {arg}")
            walked.extend(found)
        elif p.is_file():
            explicit.append(p)
        elif "=" in arg:
            raise UsageError(
                f"validate takes no overrides ({arg!r})",
                hint="validate checks files as written; see an override's effect with `ftune show RECIPE key=value`",
            )
        else:
            raise UsageError(f"no such file or directory: {arg}")
    bases = {b for f in [*walked, *explicit] for b in recipe_bases(f)}
    configs = {c for f in [*walked, *explicit] for c in named_config_files(f)}
    skipped = [f for f in walked if str(f.resolve()) in bases and f not in explicit]
    named = [f for f in walked if str(f.resolve()) in configs and f not in explicit and f not in skipped]
    files = [f for f in dict.fromkeys([*explicit, *walked]) if f not in skipped and f not in named]
    return files, Skipped(list(dict.fromkeys(skipped)), list(dict.fromkeys(named)), list(dict.fromkeys(runs)))


def tier_problems(loaded, check_paths: bool) -> list[Problem]:
    """The checks of validate's tiers after the loader's rules (`ftune.plan.checks`): the recipe tier (the job's
    shape and N-D layout as the recipe writes them), and with --check-paths the files tier (paths, the model folder,
    configs, the data files' first rows, reward models), in the compiler's own words: `plan` and `run` refuse
    them alike."""
    from ftune.plan import checks
    from ftune.plan.gguf import gguf_file
    from ftune.recipe.load import shown

    r = loaded.recipe
    job = checks.Job(r, Path(loaded.file).parent, world_size=checks.world_size(r.distributed),
                     model_folder=gguf_file(r) is None)
    tiers = checks.COMMANDS["validate --check-paths" if check_paths else "validate"]
    return [shown(loaded.located(p)) for p in checks.problems(job, tiers)]


def check_file(file: Path, check_paths: bool) -> Report:
    from ftune.recipe.load import display, load_recipe

    report = Report(display(file.resolve()))
    try:
        loaded = load_recipe(file)
    except RecipeError as err:
        report.problems = list(err.problems)
        return report
    except UsageError as err:
        report.problems = [Problem(err.message, hint=err.hint, location=Location(report.file))]
        report.unreadable = True
        return report
    report.problems = tier_problems(loaded, check_paths) + benchmark_problems(loaded, check_paths)
    return report


def benchmark_problems(loaded, check_paths: bool) -> list[Problem]:
    """eval.benchmarks' task names (did-you-mean over the installed lm-eval harness's names and the include
    folders'), and with --check-paths its include folders and their tasks' data files: the compiler's own check
    (`ftune.benchmarks.problems`), read from the files by hand (no lm_eval import). Without the harness the
    names it would provide go unchecked here; `plan` and `run` refuse the recipe with the install line."""
    bench = loaded.recipe.eval.benchmarks
    if bench is None:
        return []
    from ftune import benchmarks
    from ftune.recipe.load import shown

    found = benchmarks.problems(bench, Path(loaded.file).parent, check_paths=check_paths, need_harness=False)
    return [shown(loaded.located(p)) for p in found]


def _github(value: str, prop: bool = False) -> str:
    value = value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if prop else value


def render(reports: list[Report], fmt: str, skipped: Skipped) -> None:
    if fmt == "json":
        print(json.dumps({"files": [r.as_json() for r in reports]}, indent=2))
        return
    if fmt == "github":
        for r in reports:
            for p in r.problems:
                loc = p.location
                props = [f"file={_github(loc.file or r.file, True)}"]
                if loc.line:
                    props += [f"line={loc.line}", f"col={loc.column or 1}"]
                props.append("title=ftune")
                text = f"{p.path}: {p.message}" if p.path else p.message
                if p.hint:
                    text += f" ({p.hint})"
                print(f"::{p.severity} {','.join(props)}::{_github(text)}")
        return
    from ftune.cli.console import print_line, print_problems

    for r in reports:
        if r.valid:
            print_line(f"{r.file}: ok", style="green")
        else:
            print_problems(r.problems)
    bad = [r for r in reports if not r.valid]
    errors = sum(len(r.problems) for r in bad)
    summary = f"{len(reports)} recipe{'s' if len(reports) != 1 else ''} checked"
    summary += f", {len(bad)} invalid ({errors} error{'s' if errors != 1 else ''})" if bad else ", all valid"
    if skipped.bases:
        n = len(skipped.bases)
        summary += f"; {n} base file{'s' if n != 1 else ''} checked through the recipes extending them"
    print_line(summary, style="bold red" if bad else "bold green")
    left = [f"{len(skipped.configs)} accelerate/DeepSpeed config{'s' if len(skipped.configs) != 1 else ''} that "
            f"recipes name ({', '.join(map(str, skipped.configs))})" if skipped.configs else "",
            f"{len(skipped.runs)} file{'s' if len(skipped.runs) != 1 else ''} in ftune run dirs "
            f"({', '.join(sorted({str(f.parent) for f in skipped.runs}))})" if skipped.runs else ""]
    if any(left):
        print_line("not recipes, skipped: " + "; ".join(filter(None, left)))


def run(args: argparse.Namespace) -> int:
    files, skipped = collect(args.paths)
    reports = [check_file(f, args.check_paths) for f in files]
    render(reports, args.format, skipped)
    sys.stdout.flush()
    if any(r.unreadable for r in reports):
        return EXIT_USAGE
    return EXIT_OK if all(r.valid for r in reports) else EXIT_INVALID
