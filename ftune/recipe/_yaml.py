"""YAML for recipes: plain data with the position of every key and value, refusing what isn't data.

PyYAML composes the node graph; this module walks it itself so that it can record positions,
refuse duplicate keys, non-standard tags (`!!python/object`, custom `!tags`) and recursive aliases,
stop alias bombs after a fixed number of expanded nodes (well within a second), and refuse nesting
deeper than MAX_DEPTH before composing (PyYAML composes recursively: 100,000 `[` overflow the C stack).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ftune.errors import Location, Problem

Path = tuple[str | int, ...]

MAX_NODES = 100_000
"""Nodes a document may expand to (aliases counted each time they are used)."""
MAX_DEPTH = 64
"""Levels of nested mappings and lists a recipe may have (a real recipe has under 10)."""
_FAST = getattr(yaml, "CSafeLoader", None)  # libyaml: several times faster; errors re-parsed in Python

_T = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_T + t for t in ("null", "bool", "int", "float", "str", "timestamp")}
_ALLOWED_TAGS = _SCALAR_TAGS | {_T + "seq", _T + "map"}

_SYNTAX_HINTS = (
    ("'\\t'", "YAML indents with spaces, never tabs"),
    ("mapping values are not allowed", "check the indentation, and quote a value that contains ': '"),
    ("did not find expected key", "check the indentation: keys of one section must line up"),
    ("expected <block end>", "check the indentation: keys of one section must line up"),
    ("did not find expected '-'", "check the indentation of the list items"),
    ("undefined alias", "define the anchor (&name) before using it (*name)"),
    ("found unexpected end of stream", "close the quote or bracket opened here"),
    ("but found another document", "a recipe is a single YAML document: remove the '---'"),
)


@dataclass(frozen=True)
class Marks:
    """Where a key and its value are written."""

    key: Location
    value: Location


@dataclass
class Document:
    """A parsed YAML file: plain data, positions by path, and any problems found."""

    data: object = None
    marks: dict[Path, Marks] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


def _expanded_size(root: Node, distinct: list[int] | None = None) -> int:
    """Nodes the graph expands to with every alias copied out, counted without expanding (memoised).

    A recursive alias counts once here; the walker reports it. `distinct` (a list) receives the number of
    distinct nodes, i.e. the size as written: big without aliases is no alias bomb.
    """
    sizes: dict[int, int] = {}
    opened: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        children = [] if isinstance(node, ScalarNode) else node.value
        if isinstance(node, MappingNode):
            children = [n for pair in children for n in pair]
        if done:
            sizes[id(node)] = min(1 + sum(sizes.get(id(c), 1) for c in children), MAX_NODES + 1)
        elif id(node) not in opened:
            opened.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in opened)
    if distinct is not None:
        distinct.append(len(opened))
    return sizes[id(root)]


def _too_deep(text: str) -> yaml.Mark | None:
    """Where the text first nests deeper than MAX_DEPTH; None when it doesn't, or when a syntax error comes first
    (parsing reports that one). Must hold for every loader `parse` may use: both composers recurse per level.

    Scans the event stream (both parsers keep an explicit stack; only composing recurses) and stops at the first
    level too deep, so the scan is short for hostile input. libyaml first, for speed; but libyaml stops some deep
    documents with its own error before emitting level MAX_DEPTH + 1 (the issue's 100,000 `[`), so when it gives
    up, the pure-Python parser rescans: its event stream never recurses, and its verdict is the one that holds."""
    if _FAST is not None:
        try:
            return _scan_depth(text, _FAST)
        except yaml.YAMLError:
            pass
    try:
        found = _scan_depth(text, _ShortKeyLoader)
    except yaml.YAMLError:
        found = None
    if found is not None:
        return found
    try:
        return _scan_depth(text, yaml.SafeLoader)
    except yaml.YAMLError:
        return None


class _ShortKeyLoader(yaml.SafeLoader):
    """PyYAML's pure-Python parser with implicit keys cut at 128 characters instead of 1024, for the depth scan.

    Before it emits a level, PyYAML's scanner reads ahead until no pending token can still be an implicit key
    (1024 characters on one line), checking every pending one at each token: 100,000 `[` cost about 1024²/2 checks
    (0.3 s idle, 0.9 s on a loaded 2-core machine). Cutting keys shorter can only drop implicit-mapping levels or
    fail, never add a level, so a level it finds past MAX_DEPTH is real; when it finds none or fails, the full
    scanner decides (and is fast then: a deep flow is what makes it slow, and this one finds those)."""

    def stale_possible_simple_keys(self):
        for level in list(self.possible_simple_keys):
            key = self.possible_simple_keys[level]
            if key.line != self.line or self.index - key.index > 128:
                if key.required:
                    raise yaml.scanner.ScannerError("while scanning a simple key", key.mark,
                                                    "could not find expected ':'", self.get_mark())
                del self.possible_simple_keys[level]


def _scan_depth(text: str, loader_class: type) -> yaml.Mark | None:
    loader = loader_class(text)
    depth = 0
    try:
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    return event.start_mark
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    finally:
        loader.dispose()
    return None


def _depth_problem(file: str, mark) -> Problem:
    return Problem(
        f"the document nests deeper than {MAX_DEPTH} levels",
        hint="a recipe is a few levels of sections and lists: check for unclosed brackets",
        location=_loc(file, mark),
    )


class _TooDeep(Exception):
    pass


class _TooManyNodes(Exception):
    def __init__(self, node: Node) -> None:
        self.node = node


def _loc(file: str, mark) -> Location:
    return Location(file, mark.line + 1, mark.column + 1)


def syntax_problem(file: str, err: yaml.YAMLError) -> Problem:
    """A located problem for a PyYAML scanner/parser/composer error."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = _loc(file, mark) if mark is not None else Location(file)
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    text = f"YAML syntax error: {problem}" + (f" ({context})" if context else "")
    hint = next((h for needle, h in _SYNTAX_HINTS if needle in problem), "check the YAML syntax at this position")
    return Problem(text, hint=hint, location=where)


class _Walker:
    def __init__(self, file: str, loader: yaml.SafeLoader) -> None:
        self.file = file
        self.loader = loader
        self.count = 0
        self.doc = Document()
        self.active: set[int] = set()

    def problem(self, node: Node, path: Path, message: str, hint: str) -> None:
        dotted = ".".join(map(str, path))
        self.doc.problems.append(Problem(message, dotted, hint, _loc(self.file, node.start_mark)))

    def value(self, node: Node, path: Path) -> object:
        self.count += 1
        if self.count > MAX_NODES:
            raise _TooManyNodes(node)
        if len(path) > MAX_DEPTH:  # through aliases, a document can nest deeper than it is written
            self.doc.problems.append(_depth_problem(self.file, node.start_mark))
            raise _TooDeep
        if node.tag not in _ALLOWED_TAGS:
            tag = "!!" + node.tag[len(_T) :] if node.tag.startswith(_T) else node.tag
            self.problem(
                node,
                path,
                f"YAML tag '{tag}' is not allowed",
                "recipes are data, never code: remove the tag and write a plain value",
            )
            return None
        if isinstance(node, ScalarNode):
            if node.tag in (_T + "str", _T + "timestamp"):
                return node.value
            return self.loader.construct_object(node)
        if id(node) in self.active:
            self.problem(node, path, "recursive YAML alias", "an alias (*name) may not refer to its own anchor")
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return self.sequence(node, path)
            return self.mapping(node, path)
        finally:
            self.active.discard(id(node))

    def sequence(self, node: SequenceNode, path: Path) -> list:
        items = []
        for i, child in enumerate(node.value):
            where = _loc(self.file, child.start_mark)
            self.doc.marks[(*path, i)] = Marks(where, where)
            items.append(self.value(child, (*path, i)))
        return items

    def mapping(self, node: MappingNode, path: Path) -> dict:
        seen: dict[str, Node] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode) and key_node.tag != _T + "merge":
                first = seen.setdefault(key_node.value, key_node)
                if first is not key_node:
                    self.problem(
                        key_node,
                        (*path, key_node.value),
                        f"duplicate key '{key_node.value}' (first at line {first.start_mark.line + 1})",
                        "a key may appear once per section: remove one of them",
                    )
        try:
            self.loader.flatten_mapping(node)  # YAML merge keys (<<: *base)
        except yaml.MarkedYAMLError as err:
            self.doc.problems.append(syntax_problem(self.file, err))
            return {}
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                self.problem(key_node, path, "a key must be a plain name", "write `name: value`")
                continue
            key = key_node.value  # the text as written: `on:`/`yes:` stay names, not booleans
            self.doc.marks[(*path, key)] = Marks(_loc(self.file, key_node.start_mark), _loc(self.file, value_node.start_mark))
            out[key] = self.value(value_node, (*path, key))
        return out



def parse(text: str, file: str) -> Document:
    """Parse one YAML document; problems (syntax, tags, duplicates, bombs, depth) are collected, not raised."""
    deep = _too_deep(text)
    if deep is not None:
        return Document(data=None, problems=[_depth_problem(file, deep)])
    if _FAST is not None:
        try:
            return _parse(text, file, _FAST)
        except yaml.YAMLError:
            pass  # PyYAML's own parser words syntax errors better, and our hints match its words
    try:
        return _parse(text, file, yaml.SafeLoader)
    except yaml.reader.ReaderError as err:  # a control character: refused before any parsing
        before = text[: err.position]
        where = Location(file, before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1)
        message = f"character #x{err.character:04x} is not allowed in YAML"
        return Document(problems=[Problem(message, hint="remove the control character", location=where)])
    except yaml.YAMLError as err:
        return Document(data=None, problems=[syntax_problem(file, err)])


def _parse(text: str, file: str, loader_class: type) -> Document:
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return Document(data={})
        walker = _Walker(file, loader)
        distinct: list[int] = []
        try:
            if _expanded_size(node, distinct) > MAX_NODES:
                raise _TooManyNodes(node)
            walker.doc.data = walker.value(node, ())
        except _TooManyNodes as bomb:
            walker.doc = Document(data=None)
            if distinct and distinct[0] > MAX_NODES:  # as written, without any alias: just too big for a recipe
                walker.problem(node, (), f"the document has {distinct[0]:,} YAML nodes; a recipe may have at most "
                               f"{MAX_NODES:,}", "a recipe names its data files; it does not hold the data")
            else:
                walker.problem(
                    bomb.node,
                    (),
                    f"the document expands to more than {MAX_NODES:,} nodes through aliases (a YAML alias bomb?)",
                    "recipes don't need deeply nested aliases: write the values out",
                )
        except _TooDeep:
            walker.doc = Document(data=None, problems=walker.doc.problems)
        return walker.doc
    finally:
        loader.dispose()
