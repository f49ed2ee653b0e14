"""A suite file as plain data, with where each key and value is written, and its includes merged.

Suites are data, never code. The text is composed with `yaml.SafeLoader` and then walked node by node,
so only plain YAML comes through (strings, numbers, booleans, null, lists, mappings; anchors and `<<`
merges are fine): any other tag — `!!python/object`, `!!timestamp`, a local `!tag` — is a
`SuiteError` at its line, as are duplicate keys and keys that are not strings. While walking, the
start of every key and value is recorded under its path in the document (`("drafters", "dspark",
"method")`, `("matrix", "policy", 1)`), so any later check can point at the exact line and column in
the exact file, includes included.

`include:` (one path or a list, relative to the including file) is resolved here: the included files
are merged in order, then the including file on top. Mappings merge key by key, recursively; anything
else (lists, scalars) from the later file replaces the earlier value outright, so a suite can change one
field of a shared drafter but restates a matrix axis whole. Each location keeps pointing into the file
the merged value came from. A file included twice along different paths is fine; a cycle is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.suite.errors import Mark, SuiteError, did_you_mean, show

SUITE_VERSION = 1  # the suite format this harness reads; a file declares its own with `version:`
MAX_NODES = 100_000  # aliases can make a short text expand enormously; no real suite comes near this
MAX_DEPTH = 32  # mappings and lists inside each other; a real suite nests 5 deep
MAX_BYTES = 4_000_000  # a suite file (or an included one) larger than this is not a suite
INT64 = 2 ** 63  # integers are stored in 64-bit columns (seed BIGINT): anything beyond cannot be recorded
SUITE_SUFFIXES = (".yaml", ".yml")

DocPath = tuple[str | int, ...]

_YAML = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_YAML + t for t in ("str", "int", "float", "bool", "null")}


def dotted(path: DocPath) -> str:
    """("matrix", "include", 0, "drafter") -> "matrix.include[0].drafter"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Locations:
    """Where each key and each value of a document is written; an unknown path falls back to its nearest
    recorded ancestor (a value supplied by a default has no text of its own; its entry does)."""

    keys: dict[DocPath, Mark] = field(default_factory=dict)
    values: dict[DocPath, Mark] = field(default_factory=dict)

    def mark(self, path: DocPath, *, at: str = "value") -> Mark | None:
        marks = self.keys if at == "key" else self.values
        for end in range(len(path), -1, -1):
            if path[:end] in marks:
                return marks[path[:end]]
        return None

    def error(self, path: DocPath, message: str, *, at: str = "value") -> SuiteError:
        """A SuiteError pointing at `path`'s value (at="value") or key (at="key")."""
        return SuiteError(message, mark=self.mark(path, at=at), path=dotted(path))

    def under(self, prefix: DocPath) -> Locations:
        """The locations of `prefix` and everything below it."""
        n = len(prefix)
        return Locations({p: m for p, m in self.keys.items() if p[:n] == prefix},
                         {p: m for p, m in self.values.items() if p[:n] == prefix})

    def without(self, prefix: DocPath) -> Locations:
        n = len(prefix)
        return Locations({p: m for p, m in self.keys.items() if p[:n] != prefix},
                         {p: m for p, m in self.values.items() if p[:n] != prefix})

    def updated(self, other: Locations) -> Locations:
        return Locations({**self.keys, **other.keys}, {**self.values, **other.values})


@dataclass(frozen=True)
class Document:
    """A suite document's data (include resolved and removed) and where each part of it is written."""

    data: dict[str, Any]
    locations: Locations


def read_suite_file(file: str) -> str:
    """The text of a suite file: at most MAX_BYTES, UTF-8 (a bad byte is reported at its line and column)."""
    size = os.path.getsize(file)
    if size > MAX_BYTES:
        raise SuiteError(f"{file} is {size} bytes, larger than a suite can be ({MAX_BYTES}); is it a suite file?",
                         mark=Mark(file, 1, 1))
    with open(file, "rb") as handle:
        data = handle.read(MAX_BYTES + 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = len(data[data.rfind(b"\n", 0, e.start) + 1 : e.start].decode("utf-8", "replace")) + 1
        raise SuiteError(f"not UTF-8 text: byte 0x{data[e.start]:02x} cannot start or continue a character "
                         f"(a suite is UTF-8 YAML)", mark=Mark(file, line, column)) from None


def read_document(text: str, file: str) -> Document:
    """The suite at `file` (whose text is `text`) with its includes merged; `file` names it in errors
    and anchors relative includes; a name in angle brackets ("<text>") is not on disk and cannot include."""
    return _resolve(text, file, stack=())


def canonical_text(data: dict[str, Any], order: Iterable[str] = ()) -> str:
    """A document as canonical YAML: top-level keys in `order` (then the rest, sorted), every nested
    mapping sorted by key, lists as written, innermost collections in flow style (`[1, 3, 7]`). Equal
    documents give equal text, whatever their key order."""
    order = list(order)
    keys = [k for k in order if k in data] + sorted(k for k in data if k not in order)
    return yaml.safe_dump({k: _sorted(data[k]) for k in keys}, sort_keys=False, allow_unicode=True,
                          default_flow_style=None, width=100)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


# --- one file -----------------------------------------------------------------------------------------

class _Reader:
    """Walks a composed YAML node tree into plain data, recording each key's and value's mark."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.loader: yaml.SafeLoader | None = None
        self.locations = Locations()
        self.num_nodes = 0

    def read(self) -> dict[str, Any]:
        try:
            self.loader = yaml.SafeLoader(self.text)
            root = self.loader.get_single_node()
            if root is None:
                raise SuiteError("empty suite file: expected a mapping with version, name, matrix, ...",
                                 mark=Mark(self.file, 1, 1))
            self.locations.keys[()] = self.locations.values[()] = self._mark(root)
            data = self._build(root, ())
        except yaml.MarkedYAMLError as e:
            raise self._yaml_error(e) from None
        except RecursionError:  # the YAML composer recurses once per level: brackets nested by the thousand
            raise SuiteError(f"nested too deeply (mappings and lists inside each other, at most {MAX_DEPTH} levels)",
                             mark=Mark(self.file, 1, 1)) from None
        except yaml.reader.ReaderError as e:  # a character YAML does not allow; it knows the offset only
            line = self.text.count("\n", 0, e.position) + 1
            column = e.position - (self.text.rfind("\n", 0, e.position) + 1) + 1
            raise SuiteError(f"invalid YAML: character #x{e.character:04x} is not allowed ({e.reason})",
                             mark=Mark(self.file, line, column)) from None
        finally:
            if self.loader is not None:
                self.loader.dispose()
        if not isinstance(data, dict):
            raise SuiteError(f"a suite file is a mapping of keys (version, name, matrix, ...), got {show(data)}",
                             mark=self._mark(root))
        return data

    def _mark(self, node: Node) -> Mark:
        return Mark(self.file, node.start_mark.line + 1, node.start_mark.column + 1)

    def _fail(self, node: Node, path: DocPath, message: str) -> SuiteError:
        return SuiteError(message, mark=self._mark(node), path=dotted(path))

    def _build(self, node: Node, path: DocPath) -> Any:
        loader = self.loader
        assert loader is not None, "_build runs inside read()"
        self.num_nodes += 1
        if self.num_nodes > MAX_NODES:
            raise self._fail(node, path, f"document too large (over {MAX_NODES} values once aliases expand)")
        if len(path) > MAX_DEPTH:
            raise self._fail(node, path[:MAX_DEPTH], f"nested too deeply (mappings and lists inside each other, at "
                                                     f"most {MAX_DEPTH} levels)")
        if isinstance(node, MappingNode):
            self._check_tag(node, path, {_YAML + "map"})
            own = {id(k) for k, _ in node.value if k.tag != _YAML + "merge"}
            loader.flatten_mapping(node)  # resolves `<<: *anchor` merges: merged pairs first, own keys win
            out: dict[str, Any] = {}
            written: set[str] = set()
            for key_node, value_node in node.value:
                key = self._key(key_node, path)
                here = (*path, key)
                if id(key_node) in own:
                    if key in written:
                        first = self.locations.keys[here]
                        raise self._fail(key_node, here, f"duplicate key {show(key)} (first at line {first.line})")
                    written.add(key)
                self.locations.keys[here] = self._mark(key_node)
                self.locations.values[here] = self._mark(value_node)
                out[key] = self._build(value_node, here)
            return out
        if isinstance(node, SequenceNode):
            self._check_tag(node, path, {_YAML + "seq"})
            items = []
            for i, item in enumerate(node.value):
                self.locations.keys[(*path, i)] = self.locations.values[(*path, i)] = self._mark(item)
                items.append(self._build(item, (*path, i)))
            return items
        self._check_tag(node, path, _SCALAR_TAGS)
        try:
            value = loader.construct_object(node)
        except ValueError:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
            raise self._fail(node, path, f"an integer of {len(node.value)} characters does not fit a 64-bit "
                                         f"integer (|value| < 2**63)") from None
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            raise self._fail(node, path, f"{show(value)} does not fit a 64-bit integer (|value| < 2**63), "
                                         f"which is how the store keeps it")
        return value

    def _key(self, node: Node, path: DocPath) -> str:
        if isinstance(node, ScalarNode) and node.tag == _YAML + "str":
            return node.value
        value = self._build(node, path) if isinstance(node, ScalarNode) else None
        what = show(value) if isinstance(node, ScalarNode) else "a " + ("mapping" if isinstance(node, MappingNode) else "list")
        raise self._fail(node, path, f"keys must be strings, got {what} (quote it)")

    def _check_tag(self, node: Node, path: DocPath, allowed: set[str]) -> None:
        if node.tag in allowed:
            return
        tag = node.tag.replace(_YAML, "!!", 1) if node.tag.startswith(_YAML) else node.tag
        hint = "; quote the value to make it a string" if node.tag == _YAML + "timestamp" else ""  # a bare date
        raise self._fail(node, path, f"tag {tag} is not allowed: a suite is plain data (strings, numbers, "
                                     f"booleans, null, lists, mappings){hint}")

    def _yaml_error(self, e: yaml.MarkedYAMLError) -> SuiteError:
        where = e.problem_mark or e.context_mark
        mark = Mark(self.file, where.line + 1, where.column + 1) if where else Mark(self.file, 1, 1)
        if e.context and str(e.problem).startswith("but "):  # "expected a single document ... but found another"
            detail = f"{e.context}, {e.problem}"
        else:
            detail = f"{e.problem}" + (f" ({e.context})" if e.context else "")
        return SuiteError(f"invalid YAML: {detail}", mark=mark)


def _check_version(doc: Document, top: bool = False) -> None:
    data, locs = doc.data, doc.locations
    if "version" not in data and top:  # the schema reports it with every other missing key at once
        return
    if "version" not in data:
        raise locs.error((), f"missing required key 'version' (the suite format version; this harness reads "
                             f"{SUITE_VERSION})", at="key")
    version = data["version"]
    if not isinstance(version, int) or isinstance(version, bool):
        raise locs.error(("version",), f"expected an integer, got {show(version)}")
    if version > SUITE_VERSION:
        raise locs.error(("version",), f"suite format version {version} is newer than this harness reads "
                                       f"({SUITE_VERSION}); upgrade dspark-harness")
    if version < 1:
        raise locs.error(("version",), f"must be at least 1, got {version}")


# --- includes -----------------------------------------------------------------------------------------

def _resolve(text: str, file: str, stack: tuple[tuple[str, str], ...]) -> Document:
    reader = _Reader(text, file)
    doc = Document(reader.read(), reader.locations)
    _check_version(doc, top=not stack)
    if "include" not in doc.data:
        return doc
    raw = doc.data["include"]
    if isinstance(raw, str):
        includes: list[tuple[Any, DocPath]] = [(raw, ("include",))]
    elif isinstance(raw, list):
        includes = [(name, ("include", i)) for i, name in enumerate(raw)]
    else:
        raise doc.locations.error(("include",), f"expected a file name or a list of them, got {show(raw)}")
    own = Document({k: v for k, v in doc.data.items() if k != "include"}, doc.locations.without(("include",)))
    here = (os.path.abspath(file), file)
    merged = Document({}, Locations())
    for name, where in includes:
        if not isinstance(name, str) or not name:
            raise doc.locations.error(where, f"expected a file name, got {show(name)}")
        if file.startswith("<"):
            raise doc.locations.error(where, f"cannot include {show(name)} from {file}: includes are resolved from "
                                             f"the including file's directory (store Suite.resolved_text instead)")
        target = os.path.normpath(os.path.join(os.path.dirname(file), name))
        chain = [*stack, here]
        if os.path.abspath(target) in [absolute for absolute, _ in chain]:
            cycle = " -> ".join([shown for _, shown in chain] + [target])
            raise doc.locations.error(where, f"include cycle: {cycle}")
        if not os.path.isfile(target):
            siblings = sorted(p.name for p in Path(target).parent.glob("*.yaml")) if Path(target).parent.is_dir() else []
            raise doc.locations.error(where, f"included file {target} not found{did_you_mean(Path(name).name, siblings)}")
        if not target.endswith(SUITE_SUFFIXES):  # /etc/passwd, a binary, a script: only suite fragments merge
            raise doc.locations.error(where, f"included file {target} is not a YAML suite file "
                                             f"({' or '.join(SUITE_SUFFIXES)})")
        included = _resolve(read_suite_file(target), target, (*stack, here))
        merged = _merge(merged, included)
    return _merge(merged, own)


def _merge(base: Document, top: Document) -> Document:
    """`top` over `base`: mappings merge recursively, any other value of `top` replaces `base`'s."""
    data, locations = _merge_at(base.data, top.data, (), base.locations, top.locations)
    root = top.locations.keys.get(()) or base.locations.keys.get(())
    if root is not None:
        locations = locations.updated(Locations({(): root}, {(): root}))
    return Document(data, locations)


def _merge_at(base: dict[str, Any], top: dict[str, Any], path: DocPath, base_locs: Locations,
              top_locs: Locations) -> tuple[dict[str, Any], Locations]:
    out: dict[str, Any] = {}
    locs = Locations()
    for key, value in base.items():
        if key not in top:
            out[key] = value
            locs = locs.updated(base_locs.under((*path, key)))
    for key, value in top.items():
        here = (*path, key)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            out[key], inner = _merge_at(base[key], value, here, base_locs, top_locs)
            own = Locations({here: top_locs.keys[here]}, {here: top_locs.values[here]})
            locs = locs.updated(inner).updated(own)
        else:
            out[key] = value
            locs = locs.updated(top_locs.under(here))
    return out, locs
