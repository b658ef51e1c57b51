"""`ftune` entry point: a table of commands as import strings, so `--help` imports nothing heavy.

Each command module defines `add_arguments(parser)` and `run(args) -> int`; only the module of the
command being run is imported. User errors (`FtuneError`) are rendered as message + hint and mapped
to exit codes; a traceback appears only with `--debug`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import NamedTuple

from ftune import __version__
from ftune.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, FtuneError, UsageError
from ftune.quiet import quiet_bitsandbytes

# The training stack that `pip install ftune` leaves out (`pip install "ftune[train]"` brings it), by import name.
TRAIN_STACK = ("torch", "transformers", "peft", "accelerate", "datasets", "safetensors", "tensorboard", "matplotlib")
INSTALL_TRAIN = 'pip install "ftune[train]"'


class Command(NamedTuple):
    module: str
    summary: str
    requires: tuple[str, ...] = ()
    """Packages (import names) the command needs beyond the light install; checked before its module is imported."""


COMMANDS: dict[str, Command] = {
    "run": Command("ftune.cli.run", "compile a recipe into a plan and train it through accelerate launch", TRAIN_STACK),
    "validate": Command("ftune.cli.validate", "check recipe files: every problem at once, with file:line:column"),
    "show": Command("ftune.cli.show", "print the fully resolved recipe (--origin: where each value came from)"),
    "plan": Command(
        "ftune.cli.plan",
        "what a recipe will do and cost: parameters, memory, steps, launch command",
        ("torch", "transformers", "peft"),  # the estimate builds the model (and the adapter) on the meta device
    ),
    "data": Command("ftune.cli.data", "inspect the training data as the model will see it", ("torch", "transformers", "datasets")),
    "eval": Command(
        "ftune.cli.eval", "evaluate a trained model on the recipe's eval data",
        ("torch", "transformers", "peft", "accelerate", "datasets"),
    ),
    "export": Command("ftune.cli.export", "export a run or model folder as a GGUF file, verified, written atomically",
                      ("torch", "transformers", "peft")),
    "merge": Command(
        "ftune.cli.merge", "merge a LoRA run into its base: a plain HF model folder, verified, written atomically",
        ("torch", "transformers", "peft", "accelerate", "datasets", "safetensors"),
    ),
    "generate": Command(
        "ftune.cli.generate", "generate with a run's model (adapter, merged or QLoRA): its prompt format and stop tokens",
        ("torch", "transformers", "peft", "accelerate", "datasets"),
    ),
    "chat": Command(
        "ftune.cli.chat", "chat with a run's model in the terminal (/reset, /system, /set, /save)",
        ("torch", "transformers", "peft", "accelerate", "datasets"),
    ),
    "report": Command("ftune.cli.report", "a run's report as one HTML file: curves, metrics, predictions, recipe, "
                      "plan; several runs compared"),
    "import": Command("ftune.cli.import_", "write an ftune recipe from an axolotl, LLaMA-Factory or torchtune config"),
    "launch-script": Command("ftune.cli.launch_script",
                             "write a job spec (slurm, kubernetes, skypilot): one `ftune run` per node, ranks from the scheduler"),
}


def check_requirements(command: str) -> None:
    """A command that needs the training stack, where it is not installed: an error with the install line."""
    missing = [name for name in COMMANDS[command].requires if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"`ftune {command}` needs the training stack; not installed: {', '.join(missing)}",
            hint=f"{INSTALL_TRAIN} (on a GPU machine, install the torch build for its CUDA first); "
            "`ftune validate` and `ftune show` need only `pip install ftune`",
        )


EPILOG = """exit codes: 0 ok · 1 invalid recipe or input · 2 usage or I/O error · 3 run failed · 4 non-finite loss
            · 5 run dir in use · 130 interrupted · 143 terminated (checkpoint saved)
docs: README.md · recipes/ has shipped recipes · schemas/recipe.schema.json for editors"""


def _base_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftune",
        description="Declarative fine-tuning for LLMs.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ftune {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    parser.add_argument("--verbose", action="store_true", help="show the libraries' warnings and progress bars")
    return parser


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The full parser; only `command`'s module is imported to add its arguments."""
    parser = _base_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.summary, description=cmd.summary)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks for errors")
        p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="show the libraries' warnings and progress bars")
        if name == command:
            importlib.import_module(cmd.module).add_arguments(p)
    return parser


def _find_command(argv: list[str]) -> str | None:
    for arg in argv:
        if arg in COMMANDS:
            return arg
        if not arg.startswith("-"):
            return None
    return None


def _io_error(err: OSError) -> bool:
    """An OSError about a path or a device the user named (a name too long, a full disk, no permission): exit 2,
    the documented I/O error, rather than an internal error."""
    import errno

    return err.filename is not None or err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG,
                                                     errno.EACCES, errno.EPERM, errno.EIO)


def main(argv: list[str] | None = None) -> int:
    """Run one command; with stdin or stdout closed at start (Python sets them to None), they read as empty and
    write nowhere, and a command whose result is its output (`import`, `launch-script`) says it can't write it."""
    closed = [name for name in ("stdin", "stdout") if getattr(sys, name) is None]
    for name in closed:
        stream = open(os.devnull, "r" if name == "stdin" else "w")
        stream.ftune_closed = True  # type: ignore[attr-defined]  (read by console.write_stdout)
        setattr(sys, name, stream)
    try:
        return _main(argv)
    finally:
        for name in closed:
            getattr(sys, name).close()
            setattr(sys, name, None)


def _main(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _find_command(argv)
    debug = "--debug" in argv or os.environ.get("FTUNE_DEBUG") == "1"
    quiet_bitsandbytes()  # before any command imports it (light: the logging module only)
    if "--verbose" in argv:
        os.environ["FTUNE_VERBOSE"] = "1"  # read by ftune.quiet, here and in the workers
    try:
        if command is not None:
            check_requirements(command)
        parser = build_parser(command)
        args, extra = parser.parse_known_args(argv)
        if extra:
            # `ftune run r.yaml --dry-run key=value`: overrides may follow options (argparse can't intermix them).
            if hasattr(args, "overrides") and all("=" in e or e.startswith("~") for e in extra):
                args.overrides = [*args.overrides, *extra]
            else:
                parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        return int(importlib.import_module(COMMANDS[args.command].module).run(args) or 0)
    except FtuneError as err:
        if debug:
            raise
        from ftune.cli.console import print_error

        print_error(err)
        return err.exit_code
    except KeyboardInterrupt:
        print("ftune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `ftune validate ... | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0
    except OSError as err:
        if debug or not _io_error(err):
            return _internal(err, debug)
        where = f"{err.filename}: " if err.filename else ""
        print(f"ftune: error: {where}{err.strerror or err}", file=sys.stderr)
        print("    hint: check the path, the disk and the permissions (an I/O error, exit 2)", file=sys.stderr)
        return EXIT_USAGE
    except RuntimeError as err:
        if debug or "home directory" not in str(err):
            return _internal(err, debug)
        # Path.expanduser on `~name` for a user that does not exist
        print(f"ftune: error: a path starting with ~ names an unknown user's home ({err})", file=sys.stderr)
        print("    hint: write the path out, or use ~/ for your own home", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # a bug or an unexpected library failure: short message unless --debug
        return _internal(err, debug)


def _internal(err: Exception, debug: bool) -> int:
    if debug:
        raise err
    print(f"ftune: internal error: {type(err).__name__}: {err}", file=sys.stderr)
    print("    hint: rerun with --debug for the traceback, and report it", file=sys.stderr)
    return EXIT_RUNTIME


def entry() -> None:
    """The `ftune` program: `main()`, then exit without the interpreter's last garbage collections. A command that
    loaded torch and a model's config holds ~460,000 objects; collecting them at exit took 7 s on a busy 2-core
    machine (up to 25 s with two CPU hogs), after the work was done and its result printed: node 0 of a job whose
    peer died reported it at once and exited that much later. Frozen objects are not collected; atexit handlers
    and the streams' flush still run. Not in `main()`: the tests call it in-process."""
    import gc

    code = main()
    gc.disable()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
