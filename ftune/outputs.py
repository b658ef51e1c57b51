"""The output policy: where a command may write, what it may replace, and how it writes (atomically).

Every command that writes a user-named output goes through `check_output` (before any work is done) and
then through `write_text`, `append_line` or `publish_folder` (`publish_entry` for a shared cache's entries): `ftune merge --out`, `ftune import -o`,
`ftune launch-script -o`, `ftune chat`'s `/save`, and the run dir's own files (`write_text_atomic`).
Refused, located at the path (exit 1, exit 5 for a live run dir):

- a filesystem root, your home directory, the working directory, or a folder holding one of them;
- a run dir itself, or, inside one, its own files and folders (final/, checkpoints/, plan.json, ...);
  a live run dir (its lock held by another process) is refused with exit 5 naming the holder;
- a model folder (config.json with weights, or an adapter), the merge's base, or anything inside them;
- an output equal to (or inside, or holding) one of the command's inputs;
- an existing output without `--force`; with `--force`, only an output of the same kind that carries
  ftune's marker is replaced (a finished merge, a recipe `ftune import` wrote, a script `launch-script` wrote).

Light: no torch, so light commands (`import`, `launch-script`) stay light.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ftune.errors import EXIT_BUSY, EXIT_USAGE, FtuneError, Location, UsageError

PARTIAL = ".partial-"
"""A folder output is written as `.<name>.partial-<pid>` next to it and renamed when complete."""

# ftune's markers: the files by which it recognises what it wrote (ftune.rundir and ftune.adapter re-export them)
RUN_MARKER = "ftune_run.json"
"""Written at the top of a run dir when ftune creates (or adopts an empty) folder: ftune deletes or writes
only inside folders holding it."""
LOCK_FILE = ".ftune.lock"
"""Held (flock) by the live ftune process of a run dir; holds its pid, host and start time."""
COMPLETE_MARKER = "ftune_complete.json"
"""Written into a checkpoint, final/ or a merged folder once everything in it is on disk."""
FINAL, CHECKPOINTS, PLAN = "final", "checkpoints", "plan.json"
"""A run dir's model folders and its plan (ftune.rundir.RunDir names them from here): the folders are refused as
outputs even before the run writes them, the plan marks a run dir of an older ftune (without RUN_MARKER)."""
RUN_NAMES = frozenset({FINAL, CHECKPOINTS})
RECORD = "ftune.json"
"""final/ftune.json (the save stage) and <merged>/ftune.json (merge) record what the folder holds."""
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class Kind:
    """One kind of output: a file or a folder, and how ftune recognises one it wrote (for `--force`)."""

    name: str
    folder: bool
    marker: str
    """For a file: text its first lines hold. For a folder: a file in it (and `record_key` in ftune.json)."""
    label: str = ""
    """What one ftune wrote is called in messages: 'a finished merge'."""
    record_key: str = ""

    def carries_marker(self, path: Path) -> bool:
        if self.folder:
            if not (path / COMPLETE_MARKER).is_file():
                return False
            try:
                return self.record_key in json.loads((path / RECORD).read_text())
            except (OSError, ValueError, TypeError):
                return False
        try:
            with path.open(encoding="utf-8", errors="replace") as f:
                head = f.read(4096)
        except OSError:
            return False
        return self.marker in head


MERGED = Kind("merged model", folder=True, marker=COMPLETE_MARKER, label="a finished merge", record_key="merged_from")
RECIPE = Kind("recipe", folder=False, marker="# Imported from the ", label="a recipe `ftune import` wrote")
SCRIPT = Kind("script", folder=False, marker="# Written by `ftune launch-script",
              label="a script `ftune launch-script` wrote")
GGUF = Kind("GGUF file", folder=False, marker="ftune.exported_by", label="a GGUF `ftune export` wrote")
REPORT = Kind("report", folder=False, marker='<meta name="generator" content="ftune report',
              label="a report `ftune report` wrote")
CHAT_LOG = Kind("chat log", folder=False, marker='{"messages": ', label="a chat log `/save` wrote")
"""Appended to, never replaced: an existing file must already be a chat jsonl (or empty)."""


def refuse(path: Path | str, message: str, hint: str | None = None, exit_code: int | None = None) -> FtuneError:
    return FtuneError(message, hint=hint, location=Location(file=str(path)), exit_code=exit_code)


def _is_model_folder(folder: Path) -> bool:
    if (folder / ADAPTER_CONFIG).is_file():
        return True
    if not (folder / "config.json").is_file():
        return False
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")) or any(folder.glob("*.index.json"))


def _is_run_dir(folder: Path) -> bool:
    return (folder / RUN_MARKER).is_file() or (folder / PLAN).is_file()


# ---------------------------------------------------------------- who holds a run dir (ftune.launch.lock takes it)
def start_ticks(pid: int) -> int | None:
    """When a process started (Linux clock ticks since boot): a reused pid has another start time."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])


def pid_alive(pid: int, start: int | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    except (OverflowError, ValueError):
        return False
    return start is None or start_ticks(pid) in (None, start)


def read_lock_record(fd: int) -> dict:
    try:
        data = os.pread(fd, 65536, 0)
        record = json.loads(data) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def describe_holder(holder: dict) -> str:
    if "pid" not in holder:  # it took the lock an instant ago and has not written its record yet
        return f"{holder.get('command', 'another ftune process')} (starting: its lock record is not written yet)"
    return (f"{holder.get('command', 'ftune')} (pid {holder['pid']} on {holder.get('host', 'an unknown host')}, "
            f"since {holder.get('started', 'an unknown time')})")


def lock_holder(run_root: Path) -> dict | None:
    """Who holds the run dir's lock now (their record; {} while it is being written), or None. A probe that takes
    nothing; this process's own lock is no holder; a record whose process is gone (a killed run) is none either."""
    import fcntl
    import socket

    try:
        fd = os.open(run_root / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        record = read_lock_record(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None if record.get("pid") == os.getpid() else record
        except OSError:
            pass
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        pid = record.get("pid")
        if record.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid() and \
                pid_alive(pid, record.get("pid_start")):
            return record  # alive but not holding the flock (a filesystem without flock): trust the record
        return None
    finally:
        os.close(fd)


def _special() -> dict[Path, str]:
    out = {Path("/"): "a filesystem root", Path.cwd().resolve(): "the working directory"}
    try:
        out[Path.home().resolve()] = "your home directory"
    except RuntimeError:  # no HOME and no passwd entry
        pass
    return out


def _resolve(path: Path | str) -> Path:
    return Path(os.path.abspath(Path(path).expanduser())).resolve()


def check_output(path: Path | str, kind: Kind, *, inputs: Iterable[Path | str] = (),
                 protected: Iterable[tuple[Path | str, str]] = (), force: bool = False,
                 flag: str = "-o") -> Path:
    """The resolved output path, or a located refusal (see the module docstring). `inputs`: files and folders
    the command reads; `protected`: (folder, what it is) that must not be written, e.g. a merge's base."""
    shown = str(path)
    if not shown.strip():
        raise UsageError(f"{flag}: the output path is empty", hint=f"name a {kind.name} {'folder' if kind.folder else 'file'}")
    out = _resolve(path)
    # 1. the places nothing may replace
    for place, what in _special().items():
        if out == place:
            raise refuse(out, f"{flag} {shown} is {what}; ftune never writes a {kind.name} there",
                         hint=f"name a new {'folder' if kind.folder else 'file'} below it")
        if kind.folder and out in place.parents:
            raise refuse(out, f"{flag} {shown} holds {what} ({place}); ftune never replaces it",
                         hint="name a new folder")
    # 2. run dirs, then model folders, at the output or above it
    for above in [out, *out.parents]:
        if not above.is_dir() or not _is_run_dir(above):
            continue
        live = lock_holder(above)
        if live is not None:
            raise refuse(out, f"{flag} {shown} is {'inside ' if above != out else ''}the run dir {above}, "
                         f"in use by {describe_holder(live)}", hint="wait for it to finish, or write elsewhere",
                         exit_code=EXIT_BUSY)
        if above == out:
            raise refuse(out, f"{flag} {shown} is a run dir; ftune never replaces one with a {kind.name}",
                         hint=f"write to a new path, e.g. {out / 'merged' if kind.folder else out / 'out'}")
        # inside a run dir: only a new name, or an output of this kind ftune wrote there (its merged/)
        parts = out.relative_to(above).parts
        first = above / parts[0]
        if (first.exists() or first.is_symlink() or parts[0] in RUN_NAMES) and \
                not (first == out and kind.carries_marker(out)):
            raise refuse(out, f"{flag} {shown} is {'inside ' if len(parts) > 1 else ''}{parts[0]} of the run dir "
                         f"{above}, which the run owns", hint=f"write to a new name in the run dir (e.g. "
                         f"{above / 'merged'}) or elsewhere")
    for above in [out, *out.parents]:
        if above.is_dir() and _is_model_folder(above):
            if above == out and kind.carries_marker(out):
                continue  # an existing output of this kind: the existence check below decides
            raise refuse(out, f"{flag} {shown} is {'inside ' if above != out else ''}the model folder {above}; "
                         "ftune never writes into a model", hint="write the output to a new folder")
    # 3. the command's own inputs, and what it was told to protect
    for given in inputs:
        src = _resolve(given)
        if out == src or (src.exists() and out.exists() and os.path.samefile(src, out)):
            raise refuse(out, f"{flag} {shown} is the command's own input", hint="write the output to another path")
        if src in out.parents:
            raise refuse(out, f"{flag} {shown} is inside the command's input {src}", hint="write it elsewhere")
        if out in src.parents:
            raise refuse(out, f"{flag} {shown} holds the command's input {src}", hint="write it elsewhere")
    for folder, what in protected:
        src = _resolve(folder)
        if out == src or src in out.parents:
            raise refuse(out, f"{flag} {shown} is {'inside ' if out != src else ''}{what} ({src}); ftune never "
                         "writes there", hint="write the output to a new folder")
    # 4. what is there already
    if out.exists() or out.is_symlink():
        if kind is CHAT_LOG:
            if not out.is_file():
                raise refuse(out, f"{shown} is {'a folder' if out.is_dir() else 'not a regular file'}; /save "
                             "appends to a .jsonl file", hint="name a file, e.g. /save chats.jsonl", exit_code=EXIT_USAGE)
            if out.stat().st_size and not kind.carries_marker(out):
                raise refuse(out, f"{shown} exists and is not {kind.label} (a jsonl of "
                             '{"messages": ...} rows); /save never appends to another file',
                             hint="name a new file", exit_code=EXIT_USAGE)
            return out
        is_dir = out.is_dir()
        if kind.folder != is_dir or not (is_dir or out.is_file()):
            what = "a folder" if is_dir else "a file" if out.is_file() else "not a regular file"
            raise refuse(out, f"{flag} {shown} exists and is {what}, not a {kind.name}"
                         f"{' folder' if kind.folder else ' file'}; ftune never replaces it",
                         hint="name a new path", exit_code=EXIT_USAGE)
        ours = kind.carries_marker(out)
        if not force:
            raise refuse(out, f"{shown} already exists ({kind.label})" if ours else
                         f"{shown} already exists and is not {kind.label}",
                         hint=("pass --force to replace it, or " if ours else "") + f"name a new path with {flag}",
                         exit_code=EXIT_USAGE)
        if not ours:
            raise refuse(out, f"{shown} exists and is not {kind.label}; --force replaces only that",
                         hint=f"name a new path with {flag}")
    # 5. the folder it goes in
    parent = out.parent
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise refuse(out, f"can't write {shown}: {probe} is not a folder", exit_code=EXIT_USAGE)
    if not os.access(probe, os.W_OK | os.X_OK):
        raise refuse(out, f"can't write {shown}: {probe} is not writable", hint="check the folder's permissions",
                     exit_code=EXIT_USAGE)
    return out


WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG)
"""Errors that mean "this output can't be written here" (not a bug, not a missing input)."""


def io_error(err: OSError, path: Path | str) -> FtuneError:
    """An OSError while writing an output, as a user error naming the path (exit 2)."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return refuse(path, f"no space left on the device holding {path}; nothing was written",
                      hint=f"free space there (`df -h {Path(path).parent}`) or write elsewhere", exit_code=EXIT_USAGE)
    return refuse(path, f"can't write {path}: {err.strerror or err}", hint="check the folder and its permissions",
                  exit_code=EXIT_USAGE)


def write_text_atomic(path: Path, text: str, *, mode: int | None = None) -> None:
    """Write `text` to a temporary sibling, flush it to disk, and rename it over `path`: a crash or a full disk
    never leaves a half-written file. Raises OSError (the temporary file is removed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            tmp.chmod(mode)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """`write_text_atomic` for a command's checked output: errors are located user errors (exit 2)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text, mode=mode)
    except OSError as err:
        raise io_error(err, path) from None


def append_line(path: Path, line: str) -> None:
    """Append one line to a checked output, atomically (the file is rewritten to a sibling and renamed)."""
    try:
        old = path.read_text(encoding="utf-8") if path.is_file() else ""
    except (OSError, UnicodeDecodeError) as err:
        raise refuse(path, f"can't read {path} to append to it: {err}", exit_code=EXIT_USAGE) from None
    if old and not old.endswith("\n"):
        old += "\n"
    write_text(path, old + line.rstrip("\n") + "\n")


def partial_folder(out: Path) -> Path:
    """The hidden sibling a folder output is written into (this process's)."""
    return out.parent / f".{out.name}{PARTIAL}{os.getpid()}"


def stale_partials(out: Path) -> list[Path]:
    """Hidden partial folders of `out` left by killed writers (never results)."""
    return sorted(out.parent.glob(f".{out.name}{PARTIAL}*"))


def publish_folder(tmp: Path, out: Path) -> None:
    """Rename a finished `tmp` folder to `out`; an existing `out` (already checked: ours, with --force) is moved
    aside first and removed only after the new one is in place."""
    trash = None
    if out.exists():
        trash = out.parent / f".{out.name}.replaced-{os.getpid()}"
        out.rename(trash)
    try:
        tmp.rename(out)
    except BaseException:
        if trash is not None:
            trash.rename(out)
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


def publish_entry(tmp: Path, dest: Path, done) -> Path:
    """Rename a finished `tmp` folder to `dest`, an entry of a shared cache (the data cache, converted GGUF
    folders): first writer wins. Unlike `publish_folder` an entry is never replaced: when another process
    published `dest` first (`done(dest)`), theirs is kept (a reader may be using it) and `tmp` removed. A `dest`
    that is there but not done is a leftover (an entry appears only by this rename) and is cleared first. `tmp`
    sits beside `dest` (same filesystem: the rename is atomic)."""
    try:
        if dest.exists() and not done(dest):
            shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    except OSError:
        if not done(dest):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return dest
