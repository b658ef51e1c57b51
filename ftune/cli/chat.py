"""`ftune chat RUN_DIR_OR_MODEL`: a multi-turn chat in the terminal that streams the answer as it is decoded.

Commands: /reset, /system TEXT, /set temperature=0.7 (top_p, max_new_tokens, seed), /image PATH (a
vision-language run: shows the image with the next message), /save FILE (appends the conversation as a
`format: chat` jsonl row a recipe can train on; `vision-chat` with images), /help, /quit. Reads stdin, so a script can
drive it: `printf 'hi\\n/save c.jsonl\\n' | ftune chat runs/x`.
"""

from __future__ import annotations

import argparse
import sys

from ftune.errors import FtuneError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ftune.cli.generate import add_model_arguments

    add_model_arguments(p)
    p.add_argument("--system", help="system prompt to start with")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from ftune.cli.generate import check_decoding, dispatch
    from ftune.infer.chat import HELP, Quit, Session
    from ftune.infer.load import load_for_generation
    from ftune.infer.source import resolve

    check_decoding(args)
    extra = dispatch(args)
    console = Console(highlight=False, soft_wrap=True)
    target = resolve(args.target, allow_model=True)
    lo = load_for_generation(target, extra=extra)
    session = Session(lo, temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens,
                      seed=args.seed, system=args.system, inputs=(target.model_dir,),
                      max_images=target.plan.data.max_images if lo.vision is not None else None,
                      on_note=lambda note: console.print(f"[dim]{escape(note)}[/dim]"))
    stdin = sys.stdin  # None when the process started with stdin closed: no input, the chat ends at once
    tty = stdin is not None and not stdin.closed and stdin.isatty()
    images = ", images with /image PATH" if lo.vision is not None else ""
    console.print(f"[bold]chat[/bold] with {escape(lo.description)} ({lo.fmt.format} prompts{images})")
    if lo.fmt.format != "chat":
        console.print("[yellow]note[/yellow]: the run trained on single-turn prompts; each message is answered alone")
    console.print(f"[dim]{escape(HELP)}[/dim]")
    while True:
        if tty:
            console.print("[bold cyan]you>[/bold cyan] ", end="")
        try:
            line = stdin.readline() if stdin is not None else ""
        except (OSError, ValueError):  # a closed or unreadable stdin ends the chat like end of input
            line = ""
        if not line:
            break
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("/"):
            try:
                console.print(f"[dim]{escape(session.command(line))}[/dim]")
            except Quit:
                break
            except FtuneError as err:  # a mistyped command: say so and go on
                console.print(f"[red]{escape(err.render())}[/red]")
            continue
        console.print("[bold green]model>[/bold green] ", end="")
        try:
            session.reply(line, on_text=lambda t: console.print(escape(t), end=""))
        except FtuneError as err:  # a turn that does not fit the context: say so, keep the conversation
            console.print(f"\n[red]{escape(err.render())}[/red]")
            continue
        console.print()
    return 0
