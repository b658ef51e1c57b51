"""`ftune show RECIPE [key=value ...]`: the fully resolved recipe (bases merged, `${}` resolved,
overrides applied, defaults filled, secrets masked). `--origin` says where each value came from.
"""

from __future__ import annotations

import argparse
import json

from ftune.errors import EXIT_OK, Location


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", metavar="RECIPE", help="recipe file")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="override a key (train.max_steps=5, peft.target_modules=[q_proj], quantization=null); ~key deletes it",
    )
    parser.add_argument("--origin", action="store_true", help="annotate each value with file:line:col, override or default")
    parser.add_argument("--format", choices=("yaml", "json"), default="yaml", help="output format (default: yaml)")


def _origin_text(where: Location | None, path: str = "", overrides: tuple[str, ...] = ()) -> str:
    from ftune.recipe import shown_override
    from ftune.recipe.load import display

    if where is None:
        return "default"
    if where.file:
        return f"{display(where.file)}:{where.line}:{where.column}"
    if where.origin == "override":
        arg = next((a for a in reversed(overrides) if (path + ".").startswith(a.partition("=")[0] + ".")), None)
        return f"override {shown_override(arg)}" if arg else "override"
    return where.origin or "default"


def origins(loaded, overrides: tuple[str, ...] = ()) -> dict[str, str]:
    """Each resolved key's origin as `--origin` prints it (`ftune run` records them for `ftune report`)."""
    return {k: _origin_text(v, k, overrides) for k, v in loaded.origins.items()}


def _scalar(value: object) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def annotated_yaml(data: dict, origins: dict[str, Location], overrides: tuple[str, ...] = ()) -> str:
    """The recipe as YAML with `# origin` after every key (lists of scalars stay on one line)."""
    rows: list[tuple[str, str]] = []

    def emit(value: dict, path: str, indent: int) -> None:
        for key, v in value.items():
            p = f"{path}.{key}" if path else str(key)
            pad, origin = " " * indent, _origin_text(origins.get(p), p, overrides)
            if isinstance(v, dict) and v:
                rows.append((f"{pad}{key}:", origin))
                emit(v, p, indent + 2)
            elif isinstance(v, list) and v and all(isinstance(i, dict) for i in v):
                rows.append((f"{pad}{key}:", origin))
                for i, item in enumerate(v):
                    start = len(rows)
                    emit(item, f"{p}.{i}", indent + 2)
                    if len(rows) > start:
                        text, o = rows[start]
                        rows[start] = (f"{pad}- {text[indent + 2:]}", o)
            else:
                rows.append((f"{pad}{key}: {_scalar(v)}", origin))

    emit(data, "", 0)
    width = min(max(len(t) for t, _ in rows) + 2, 72)
    return "\n".join(f"{t.ljust(width)}# {o}" for t, o in rows) + "\n"


def run(args: argparse.Namespace) -> int:
    from ftune.recipe import load_recipe
    from ftune.recipe import shown_override
    from ftune.recipe.load import display

    loaded = load_recipe(args.recipe, args.overrides)
    if args.format == "json":
        data = loaded.recipe.model_dump(mode="json", exclude={"extends"})
        out: dict = data
        if args.origin:
            out = {"recipe": data, "origins": origins(loaded, tuple(args.overrides))}
        print(json.dumps(out, indent=2))
        return EXIT_OK
    sources = [display(f) for f in loaded.files]
    header = f"# resolved from {sources[0]}" + (f" (bases: {', '.join(sources[1:])})" if len(sources) > 1 else "")
    if args.overrides:
        header += "\n# overrides: " + " ".join(shown_override(a) for a in args.overrides)
    if loaded.secrets:
        header += "\n# masked secrets (read from the environment at run time): " + ", ".join(
            f"{k} <- ${v}" if v not in loaded.secret_env else f"{k} (passed to the run as ${v}, never written)"
            for k, v in loaded.secrets.items()
        )
    if args.origin:
        data = loaded.recipe.model_dump(mode="json", exclude={"extends"})
        body = annotated_yaml(data, loaded.origins, tuple(args.overrides))
    else:
        body = loaded.resolved_yaml()
    print(header + "\n" + body, end="")
    return EXIT_OK
