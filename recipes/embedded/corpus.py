"""The embedded target's training corpus: three domains, as chat examples, from sources on any machine.

The harness measures speculative decoding on three task families (math: GSM8K, code: HumanEval, chat:
MT-Bench), and acceptance depends on how the target writes in each. So the target learns one source per
family, phrased the way the harness prompts it (see `inputs/tasks/*.yaml`):

- **math**: GSM8K train, user = question + the GSM8K task's instruction line, assistant = the reference
  solution with the calculator annotations (`<<48/2=24>>`) removed and the final `#### 42` rewritten as
  `\\boxed{42}`. Read from `<data_dir>/gsm8k/train.jsonl`.
- **code**: functions with a docstring from this Python's standard library, user = "Complete the
  following python code:" + signature + docstring (HumanEval's shape), assistant = the whole function.
- **chat**: English prose shipped with every CPython. Python's documentation topics (`pydoc_data.topics`),
  cut into sections at their headings and into paragraph-aligned chunks: user = "Explain <heading>.",
  assistant = the first chunk, then a second turn "Tell me more." → the next chunk, so the model has seen
  two-turn dialogues like MT-Bench's. Plus long module and class docstrings of the stdlib ("What is the
  Python module json for?" → its docstring). All of it is under 1 MB of text, so this domain is the
  smallest; the default caps keep the other two close to it.

Selection is deterministic and seed-free: examples are ordered by a hash of a stable key (file path +
function name, GSM8K line number, topic + chunk), the first `num_val` of each domain are held out for
validation, and the training set takes examples in that order until the domain's character cap. Code
walks files in hash order, holds out whole files for validation and stops at the cap, so a small build
parses few files. The code and chat domains depend on the Python version (the stdlib differs), so
`Corpus.fingerprint()` goes in reports.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DOMAINS = ("math", "code", "chat")

# Same lines as inputs/tasks/gsm8k.yaml and humaneval.yaml, so training prompts look like eval prompts.
MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_INSTRUCTION = "Complete the following python code:"


@dataclass(frozen=True)
class ChatExample:
    domain: str  # one of DOMAINS
    key: str  # stable id, e.g. "gsm8k:41", "code:json/decoder.py:py_scanstring", "chat:assert:0"
    turns: tuple[tuple[str, str], ...]  # (user, assistant) pairs, rendered in order

    @property
    def num_chars(self) -> int:
        return sum(len(u) + len(a) for u, a in self.turns)


@dataclass(frozen=True)
class CorpusCaps:
    """How much of each domain to take. Characters, not examples: domains differ in example length."""

    math_chars: int = 1_000_000
    code_chars: int = 1_000_000
    chat_chars: int = 1_000_000  # all the prose there is (≈ 0.87 M characters on CPython 3.11)
    num_val: int = 48  # held-out examples per domain
    max_function_chars: int = 1500  # longer functions are skipped (keep examples near the sequence length)
    max_chunk_chars: int = 1200  # prose chunk size (≈ 300 tokens)

    def cap(self, domain: str) -> int:
        return {"math": self.math_chars, "code": self.code_chars, "chat": self.chat_chars}[domain]


@dataclass(frozen=True)
class Corpus:
    train: tuple[ChatExample, ...]
    val: dict[str, tuple[ChatExample, ...]] = field(default_factory=dict)  # domain → held-out examples

    def fingerprint(self) -> str:
        """sha256 over every example's key and text: equal fingerprints mean identical corpora."""
        h = hashlib.sha256()
        for split, examples in [("train", self.train), *sorted(self.val.items())]:
            for ex in examples:
                h.update(json.dumps([split, ex.domain, ex.key, ex.turns]).encode())
        return h.hexdigest()

    def stats(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for d in DOMAINS:
            train = [e for e in self.train if e.domain == d]
            out[d] = {
                "train_examples": len(train),
                "train_chars": sum(e.num_chars for e in train),
                "val_examples": len(self.val.get(d, ())),
            }
        return out


def _stable_hash(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()


# ---- math -------------------------------------------------------------------------------------------

_CALC = re.compile(r"<<[^<>]*>>")
_FINAL = re.compile(r"\n?####\s*(.+?)\s*$")


def gsm8k_solution(answer: str) -> str:
    """GSM8K reference answer → the solution our math prompt asks for (no `<<…>>`, `\\boxed{}` last)."""
    text = _CALC.sub("", answer)
    match = _FINAL.search(text)
    if match is None:
        raise ValueError(f"GSM8K answer without a '#### <number>' line: {answer[-80:]!r}")
    final = match.group(1).replace(",", "")
    return f"{text[: match.start()].rstrip()}\n\\boxed{{{final}}}"


def math_examples(data_dir: str | os.PathLike | None) -> list[ChatExample]:
    """GSM8K train through the task loaders (`$HARNESS_DATA_DIR`, else the hub; their errors name the files)."""
    from inputs.tasks import gsm8k_train_pairs

    return [
        ChatExample("math", f"gsm8k:{i}", ((f"{question.strip()}\n{MATH_INSTRUCTION}", gsm8k_solution(answer)),))
        for i, (question, answer) in enumerate(gsm8k_train_pairs(data_dir))
    ]


# ---- code -------------------------------------------------------------------------------------------

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


def stdlib_files(stdlib_dir: str | os.PathLike | None = None) -> list[tuple[str, Path]]:
    """(relative path, path) of the stdlib's .py files, without tests and installed packages, in hash order."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                path = Path(dirpath) / name
                files.append((path.relative_to(root).as_posix(), path))
    return sorted(files, key=lambda f: _stable_hash(f[0]))


def _parsed_stdlib(stdlib_dir=None) -> Iterator[tuple[str, str, ast.Module]]:
    """(relative path, source, tree) of each stdlib file that reads and parses, in hash order."""
    for rel, path in stdlib_files(stdlib_dir):
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError):
            continue
        yield rel, source, tree


def functions_in_source(source: str, tree: ast.Module, rel_path: str, max_chars: int) -> Iterator[ChatExample]:
    """Every function/method with a docstring, dedented: prompt = signature + docstring, answer = all."""
    lines = source.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = node.body[0] if node.body else None
        if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str)):
            continue
        if len(node.body) < 2 or node.end_lineno is None or doc.end_lineno is None:
            continue  # a docstring and nothing else teaches nothing about code
        # node.lineno is the `def` line (decorators excluded), so the prompt starts at the signature.
        func_lines = lines[node.lineno - 1 : node.end_lineno]
        if "\t" in "".join(func_lines):
            continue
        func = textwrap.dedent("\n".join(func_lines))
        if len(func) > max_chars:
            continue
        head = "\n".join(func.splitlines()[: doc.end_lineno - node.lineno + 1])
        user = f"{CODE_INSTRUCTION}\n{head}\n"
        yield ChatExample("code", f"code:{rel_path}:{node.lineno}:{node.name}", ((user, func),))


def docstrings_in_source(tree: ast.Module, rel_path: str, min_chars: int = 200) -> Iterator[ChatExample]:
    """Module and class docstrings (English prose) as one-turn explanations for the chat domain."""
    module = rel_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= min_chars:
        yield ChatExample("chat", f"doc:{rel_path}", ((f"What is the Python module {module} for?", doc),))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= min_chars:
                user = f"What does the {node.name} class in {module} do?"
                yield ChatExample("chat", f"doc:{rel_path}:{node.lineno}:{node.name}", ((user, doc),))


@dataclass
class _StdlibHarvest:
    code_train: list[ChatExample] = field(default_factory=list)
    code_val: list[ChatExample] = field(default_factory=list)
    docstrings: list[ChatExample] = field(default_factory=list)


def harvest_stdlib(caps: "CorpusCaps", stdlib_dir=None) -> _StdlibHarvest:
    """One walk over the stdlib in file-hash order, until every quota below is met.

    Code validation takes whole files (one in 16, at most 4 functions each, for variety) until it has
    `caps.num_val` functions, so it never shares a file with code training and does not move when the
    training cap changes; code training takes the other files until `caps.code_chars`. Docstrings (for
    the chat domain) are gathered from every file walked, until `caps.chat_chars`.
    """
    out = _StdlibHarvest()
    code_chars = doc_chars = 0
    for rel, source, tree in _parsed_stdlib(stdlib_dir):
        if len(out.code_val) >= caps.num_val and code_chars >= caps.code_chars and doc_chars >= caps.chat_chars:
            break
        if doc_chars < caps.chat_chars:
            for ex in docstrings_in_source(tree, rel):
                out.docstrings.append(ex)
                doc_chars += ex.num_chars
        if int(_stable_hash(rel), 16) % 16 == 0:
            if len(out.code_val) < caps.num_val:
                functions = list(functions_in_source(source, tree, rel, caps.max_function_chars))
                out.code_val += functions[: min(4, caps.num_val - len(out.code_val))]
            continue
        for ex in functions_in_source(source, tree, rel, caps.max_function_chars):
            if code_chars >= caps.code_chars:
                break
            out.code_train.append(ex)
            code_chars += ex.num_chars
    return out


# ---- chat -------------------------------------------------------------------------------------------

_UNDERLINE = re.compile(r"^([*=\-~^])\1{2,}$")


def _sections(text: str) -> list[tuple[str, str]]:
    """Split a pydoc topic into (heading, body) at reST-style underlined headings."""
    lines = text.splitlines()
    sections: list[tuple[str, list[str]]] = []
    heading, body = "", []  # type: tuple[str, list[str]]
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and lines[i].strip() and _UNDERLINE.match(lines[i + 1].strip()) \
                and len(lines[i + 1].strip()) >= len(lines[i].strip()) - 1:
            if heading or any(b.strip() for b in body):
                sections.append((heading, body))
            heading, body = lines[i].strip(), []
            i += 2
            continue
        body.append(lines[i])
        i += 1
    sections.append((heading, body))
    return [(h, "\n".join(b).strip()) for h, b in sections if h and "\n".join(b).strip()]


def _chunks(body: str, max_chars: int) -> list[str]:
    """Paragraph-aligned chunks of at most ~max_chars (a single longer paragraph stays whole)."""
    chunks, current = [], ""
    for para in re.split(r"\n\s*\n", body):
        para = para.rstrip()
        if not para.strip() or "::=" in para:
            continue  # grammar productions are BNF, not prose
        if current and len(current) + 2 + len(para) > max_chars:
            chunks.append(current)
            current = para
        else:
            current = f"{current}\n\n{para}" if current else para
    if current:
        chunks.append(current)
    return chunks


def _heading_phrase(heading: str) -> str:
    """'The "assert" statement' → 'the "assert" statement'; acronyms and 'Python' keep their case."""
    first = heading.split(" ", 1)[0]
    if first[:1].isupper() and first[1:].islower() and first != "Python":
        return heading[0].lower() + heading[1:]
    return heading


def topic_examples(max_chunk_chars: int) -> list[ChatExample]:
    """Two-turn explanations from Python's documentation topics (English, shipped with every CPython)."""
    from pydoc_data.topics import topics

    examples = []
    for topic in sorted(topics):
        for s, (heading, body) in enumerate(_sections(topics[topic])):
            chunks = _chunks(body, max_chunk_chars)
            for j in range(0, len(chunks), 2):
                user = f"Explain {_heading_phrase(heading)}." if j == 0 else \
                    f"Continue explaining {_heading_phrase(heading)}."
                turns = [(user, chunks[j])]
                if j + 1 < len(chunks):
                    turns.append(("Tell me more.", chunks[j + 1]))
                examples.append(ChatExample("chat", f"chat:{topic}:{s}:{j}", tuple(turns)))
    return examples


# ---- the corpus -------------------------------------------------------------------------------------


def _split(examples: list[ChatExample], num_val: int, cap: int) -> tuple[list[ChatExample], list[ChatExample]]:
    """Hash order; the first `num_val` are validation, training follows until `cap` characters."""
    ordered = sorted(examples, key=lambda e: _stable_hash(e.key))
    val, rest = ordered[:num_val], ordered[num_val:]
    train, total = [], 0
    for ex in rest:
        if total >= cap:
            break
        train.append(ex)
        total += ex.num_chars
    return train, val


def build_corpus(data_dir: str | os.PathLike | None = None, caps: CorpusCaps = CorpusCaps(), stdlib_dir=None) -> Corpus:
    """All three domains, split into train (capped) and per-domain validation, in a fixed order.

    The training list is math, then code, then chat; the trainer shuffles it with its own seed.
    """
    stdlib = harvest_stdlib(caps, stdlib_dir)
    splits = {
        "math": _split(math_examples(data_dir), caps.num_val, caps.math_chars),
        "code": (stdlib.code_train, stdlib.code_val),
        "chat": _split(topic_examples(caps.max_chunk_chars) + stdlib.docstrings, caps.num_val, caps.chat_chars),
    }
    train: list[ChatExample] = []
    val: dict[str, tuple[ChatExample, ...]] = {}
    for domain in DOMAINS:
        domain_train, domain_val = splits[domain]
        if len(domain_val) < caps.num_val or not domain_train:
            raise ValueError(f"domain {domain!r}: {len(domain_train)} training and {len(domain_val)} "
                             f"validation examples (wanted {caps.num_val}); is the source complete?")
        train += domain_train
        val[domain] = tuple(domain_val)
    return Corpus(train=tuple(train), val=val)
