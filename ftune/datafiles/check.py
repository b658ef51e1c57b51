"""The pre-launch checks on the data files: does each local source have the fields, format and roles it needs?
A hub dataset the Hugging Face cache holds is checked for its fields and the answer column an RL reward reads.

Run by the compiler (`ftune plan`, `ftune run`, `--dry-run`, `ftune data`) and by `ftune validate --check-paths`,
so all of them refuse the same data. Light on purpose: it reads the first rows with the standard library
(pyarrow for Parquet), never `datasets` or a tokenizer. A file that does not exist is not reported here: the
compiler's input check (`ftune.plan.checks.environment.inputs`) says so, once. `preference_balance` (degenerate
preference pairs) runs beside `check_fields` in the same two places.
"""

from __future__ import annotations

from pathlib import Path

from ftune.errors import Problem
from ftune.hub import looks_local
from ftune.recipe.objectives import family_of
from ftune.recipe.schema import EvalSplit, Recipe
from ftune.recipe.sources import sources
from ftune.typed import not_text
from ftune.datafiles.errors import DataError, chat_fields_hint, field_hint
from ftune.datafiles.formats import DEFAULT_ROLE_MAP, ROLES, required_fields
from ftune.datafiles.sources import peek, peek_hub, resolve

PEEK_ROWS = 5


def check_fields(recipe: Recipe) -> list[Problem]:
    """Every problem found in the first rows of each local source that exists, at its recipe key. A glob's files
    are each checked as a single file would be (the messages name the file), and must have the same columns."""
    problems: list[Problem] = []
    for where, spec in sources(recipe):
        if spec.type != "hub" and spec.is_glob:
            problems += _check_glob(recipe, where, spec)
            continue
        if spec.type != "hub" and not Path(spec.path).expanduser().exists() and looks_local(spec.path):
            continue  # missing: the input check reports it (a hub name is read from the cache, where it is)
        problems += _check_source(recipe, where, spec)[0]
    return problems


def _check_glob(recipe: Recipe, where: str, spec) -> list[Problem]:
    """Each file the glob matches, checked as a single source (the first problem per file), then their columns:
    a file whose columns differ from the first file's is refused (the loader would fail after launch)."""
    files = spec.files()
    skipped = spec.run_dir_matches()
    problems: list[Problem] = []
    if skipped:
        problems.append(Problem(f"{spec.path} also matches {len(skipped)} file(s) inside ftune run dirs "
                                f"(e.g. {skipped[0]}), skipped: a run's outputs are not training data",
                                path=f"{where}.path", hint="narrow the pattern to silence this", severity="warning"))
    if not files:
        return problems  # the input check says no file matches
    try:
        resolve(spec, where)  # one file type for all
    except DataError as err:
        return [*problems, Problem.at(f"{where}.path", _strip(err.message, where), err.hint)]
    first: tuple[str, list[str]] | None = None
    for file in files:
        found, columns = _check_source(recipe, where, spec.model_copy(update={"path": file}))
        problems += found
        if found or columns is None:
            continue
        if first is None:
            first = (file, columns)
        elif set(columns) != set(first[1]):
            problems.append(Problem.at(
                f"{where}.path", f"{spec.path} matches files with different columns: {file} has "
                f"{', '.join(columns) or 'none'}, but {first[0]} has {', '.join(first[1]) or 'none'}",
                "every file of a glob must have the same columns: fix the files, or give each kind its own source"))
        if sum(p.severity == "error" for p in problems) >= 3:  # enough to act on; the rest after a fix
            break
    return problems


def _check_source(recipe: Recipe, where: str, spec) -> tuple[list[Problem], list[str] | None]:
    """One local file or folder (a glob's file: `spec.path` is it): its problems, and the columns read."""
    problems: list[Problem] = []
    try:
        src = resolve(spec, where)
        peeked = peek(src, PEEK_ROWS) if src.local else peek_hub(src, PEEK_ROWS)  # a hub dataset: the cache's files
    except DataError as err:
        return [Problem.at(f"{where}.path", _strip(err.message, where), err.hint)], None
    if peeked is None:
        return [], None
    columns, rows = peeked
    if not rows and src.kind != "disk":
        return [Problem.at(f"{where}.path", f"{spec.path} has no rows", "check the file")], columns
    missing = [(k, c) for k, c in required_fields(src).items() if c not in columns]
    defaulted = "format" not in spec.model_fields_set
    for key, col in missing:
        problems.append(Problem.at(
            where if defaulted else f"{where}.fields.{key}",
            ("this source sets no `format`, so it defaulted to text, which " if defaulted else
             f"{spec.format} data ") + f"needs field `{col}`, but the first rows of {spec.path} have: "
            f"{', '.join(columns) or 'no fields'}",
            field_hint(spec.format, columns, rows[0] if rows else None),
        ))
    if missing:
        return problems, columns
    if spec.format in ("prompt", "vision-prompt") and spec.fields.answer not in columns and (readers := answer_readers(recipe)):
        problems.append(Problem.at(f"{where}.fields.answer",
                         f"reward {', '.join(readers)} compares completions with each row's `{spec.fields.answer}`"
                         f", but the first rows of {spec.path} have: {', '.join(columns) or 'no fields'}",
                         "add an answer to every row, map its column (`fields: {answer: solution}`), or use "
                         "rewards that read no answer (regex, json, length)"))
        return problems, columns
    if not src.local:  # a hub dataset: its fields and the answer column; its rows' contents are the data stage's
        return problems, columns
    problems += _check_text_fields(where, spec, src, rows)
    if spec.format == "chat":
        problems += _check_messages(where, spec, rows)
    if spec.format in ("vision-chat", "vision-preference", "vision-prompt"):
        problems += _check_vision(where, src, rows, recipe.data.images)
    if spec.format == "classification" and recipe.model.labels:
        for n, row in enumerate(rows, start=1):
            label = row.get(spec.fields.label)
            if isinstance(label, str) and label not in recipe.model.labels:
                problems.append(Problem.at(f"{where}.fields.label",
                                 f"row {n} of {spec.path}: label {label!r} is not one of model.labels "
                                 f"({', '.join(recipe.model.labels)})",
                                 "add it to model.labels, or fix the row"))
                break
    return problems, columns


def eval_split_rows(recipe: Recipe) -> list[Problem]:
    """`data.eval.split` holds out a share of each training source, but a source keeps at least one row for
    training: when every source is a local file of at most one row, the split holds out none, which the data stage
    would find only after launch (`dataset.pipeline.mix_sources`, the same words). Sources read lightly, up to 2
    rows each; a hub source, a glob or a folder can't be counted here and passes."""
    if not isinstance(recipe.data.eval, EvalSplit):
        return []
    rows = 0
    for where, spec in sources(recipe):
        if not where.startswith("data.train") or spec.type == "hub" or spec.is_glob:
            return []
        try:
            src = resolve(spec, where)
            peeked = peek(src, 2) if src.local and Path(src.path).is_file() else None
        except DataError:
            return []  # check_fields reports it
        if peeked is None or len(peeked[1]) > 1:
            return []
        rows += len(peeked[1])
    return [Problem.at("data.eval.split", f"data.eval.split: {recipe.data.eval.split} of {rows} training "
                       f"row{'s' if rows != 1 else ''} holds out no row for evaluation (a source keeps at least one "
                       "row for training)", "add rows, give data.eval its own sources (`data.eval: [{path: ...}]`), "
                       "or remove data.eval")]


def answer_readers(recipe: Recipe) -> list[str]:
    """The recipe's rewards that read the row's answer (online RL only)."""
    from ftune.rewards import available

    rl = recipe.train.rl
    if rl is None or not family_of(recipe).generates:
        return []
    known = available()
    return [r.name for r in rl.rewards if r.name in known and known[r.name].needs_answer]


TEXT_FIELDS = {"text": ("text",), "instruction": ("instruction", "input", "output"), "classification": ("text",)}


def _check_text_fields(where: str, spec, src, rows: list[dict]) -> list[Problem]:
    """A list or an object where the format reads text (token ids, image parts): refused, not stringified."""
    for key in TEXT_FIELDS.get(spec.format, ()):
        col = getattr(spec.fields, key)
        for n, row in enumerate(rows, start=1):
            if (wrong := not_text(row.get(col))) is not None:
                return [Problem.at(f"{where}.fields.{key}", f"row {n} of {spec.path}: `{col}` holds {wrong[0]}, not text",
                         wrong[1])]
    return []


def _check_messages(where: str, spec, rows: list[dict]) -> list[Problem]:
    f = spec.fields
    mapping = {**DEFAULT_ROLE_MAP, **(spec.roles or {})}
    for n, row in enumerate(rows, start=1):
        messages = row.get(f.messages)
        if not isinstance(messages, list):
            return [Problem.at(f"{where}.fields.messages", f"row {n} of {spec.path}: `{f.messages}` is not a list", None)]
        for m in messages:
            if not isinstance(m, dict) or f.role not in m or f.content not in m:
                keys = ", ".join(m) if isinstance(m, dict) else type(m).__name__
                return [Problem.at(f"{where}.fields.role",
                         f"row {n} of {spec.path}: a message lacks `{f.role}`/`{f.content}` (has: {keys})",
                         chat_fields_hint(f.messages, m))]
            if not isinstance(m[f.role], str) or mapping.get(m[f.role]) not in ROLES:
                return [Problem.at(f"{where}.roles", f"row {n} of {spec.path}: unknown role {m[f.role]!r}",
                         f"map it, e.g. `roles: {{{m[f.role]}: assistant}}`")]
            if (wrong := not_text(m[f.content])) is not None:
                return [Problem.at(f"{where}.fields.content", f"row {n} of {spec.path}: a message's `{f.content}` holds "
                         f"{wrong[0]}, not text", wrong[1])]
    return []


def _check_vision(where: str, src, rows: list[dict], settings) -> list[Problem]:
    """The first rows' messages and images, read as the data stage will (ftune.datafiles.images): the first problem,
    at the row and field."""
    from ftune.datafiles.images import ImageProblem, completion_text, open_image, parse_prompt, parse_row

    base = Path(src.path).parent
    f = src.spec.fields
    for n, row in enumerate(rows, start=1):
        try:
            if src.spec.format == "vision-chat":
                parsed = parse_row(row.get(f.messages), src, base)
            else:
                parsed = parse_prompt(row, src, base)
                for col in ((f.chosen, f.rejected) if src.spec.format == "vision-preference" else ()):
                    completion_text(row.get(col), src, col)
            for path, at in zip(parsed.images, parsed.fields):
                open_image(path, settings, at)
        except ImageProblem as err:
            return [Problem.at(f"{where}.path", f"row {n} of {src.spec.path}, field {err.field}: {err.message}",
                               err.hint)]
    return []


def _strip(message: str, where: str) -> str:
    for prefix in (f"{where}.path: ", f"{where}: "):
        if message.startswith(prefix):
            return message[len(prefix):]
    return message


IDENTICAL_REFUSE = 0.5
"""Share of preference pairs with chosen == rejected above which a run is refused (below it: a warning). Such a
pair carries no preference: its DPO loss is log 2 = 0.6931 whatever the model does."""
BALANCE_ROWS = 200_000
"""Rows read per source for the balance check (the whole file below this)."""


def _row_list(numbers: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(n) for n in numbers[:limit])
    return shown + (f", ... ({len(numbers) - limit} more)" if len(numbers) > limit else "")


def preference_balance(recipe: Recipe) -> list[Problem]:
    """Degenerate preference data in each local train source, as problems at its key: pairs whose chosen equals
    rejected (a warning below the refusal share), and KTO labels that are all desirable or all undesirable. Read
    with the light reader before launch, so a run that can't learn anything is refused instead of training a flat
    loss."""
    found: list[Problem] = []
    for where, spec in sources(recipe, splits=("train",)):
        if spec.format not in ("preference", "unpaired-preference", "vision-preference"):
            continue
        try:
            src = resolve(spec, where)
            peeked = peek(src, BALANCE_ROWS) if src.local else None
        except DataError:
            continue  # a missing or unreadable file is reported by the path checks
        if not peeked or not peeked[1]:
            continue
        rows, f = peeked[1], spec.fields
        if spec.format in ("preference", "vision-preference"):
            same = [n for n, row in enumerate(rows, 1) if f.chosen in row and row.get(f.chosen) == row.get(f.rejected)]
            if not same:
                continue
            share = len(same) / len(rows)
            severity = "error" if share > IDENTICAL_REFUSE else "warning"
            found.append(Problem(f"{len(same)} of {len(rows)} rows of {spec.path} ({share:.0%}) have "
                          f"`{f.chosen}` equal to `{f.rejected}` (rows {_row_list(same)}): such a pair teaches no "
                          "preference (its loss stays at log 2 = 0.693)", f"{where}.path",
                          "remove those rows or fix how the pairs were built"
                          + (f"; more than {IDENTICAL_REFUSE:.0%} of them refuses the run" if severity == "warning"
                             else ""), severity=severity))
        else:
            labels = [row.get(f.label) for row in rows]
            desirable = [n for n, v in enumerate(labels, 1) if v is True]
            undesirable = [n for n, v in enumerate(labels, 1) if v is False]
            if desirable and undesirable:
                continue
            side = "desirable (true)" if desirable else "undesirable (false)"
            found.append(Problem(f"all {len(desirable) + len(undesirable)} labelled rows of "
                          f"{spec.path} are {side}: KTO learns from the contrast between desirable and undesirable "
                          "completions, so one-sided labels train nothing (a flat loss)", f"{where}.fields.label",
                          "add rows with the other label (`{f.label}: true` and `false`), or use `train.objective: "
                          "sft` on the desirable rows".replace("{f.label}", f.label)))
    return found
