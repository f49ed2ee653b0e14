"""What a cost table is valid for (device, dtype, target, context length), and the checks every table's
JSON reader shares."""

from __future__ import annotations

import difflib
import platform
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

import torch


@dataclass(frozen=True)
class SPSFingerprint:
    """What an SPS table is valid for; two tables with equal fingerprints describe the same setting."""

    device_name: str  # e.g. "NVIDIA H100 80GB HBM3", or the CPU's name
    dtype: str  # target weights/activations, e.g. "bfloat16"
    target_id: str  # model id or path, e.g. "Qwen/Qwen3-8B"
    context_len: int  # committed tokens per request the steps were measured at

    def __post_init__(self) -> None:
        for name in ("device_name", "dtype", "target_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"fingerprint {name} must be a non-empty string, got {value!r}")
        if isinstance(self.context_len, bool) or not isinstance(self.context_len, int) or self.context_len < 0:
            raise ValueError(f"fingerprint context_len must be an integer >= 0, got {self.context_len!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SPSFingerprint":
        reject_unknown(data, [f.name for f in fields(cls)], "fingerprint")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"fingerprint is missing {missing}")
        return cls(**dict(data))

    @classmethod
    def coerce(cls, value: "SPSFingerprint | Mapping[str, Any]") -> "SPSFingerprint":
        return value if isinstance(value, SPSFingerprint) else cls.from_dict(value)


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}:{platform.processor() or platform.machine() or 'unknown'}"


def fingerprint_for(target: Any, context_len: int, target_id: str | None = None) -> SPSFingerprint:
    """The fingerprint of `target` (a `TargetModel`) on its current device and dtype."""
    if target_id is None:
        target_id = getattr(target.config, "_name_or_path", "") or getattr(target.config, "model_type", "unknown")
    return SPSFingerprint(device_name(target.device), str(target.dtype).removeprefix("torch."), target_id, context_len)


def is_number(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def reject_unknown(data: Mapping[str, Any], valid: Sequence[str], where: str) -> None:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be an object, got {type(data).__name__}")
    for key in data:
        if key not in valid:
            near = difflib.get_close_matches(str(key), valid, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; valid: {', '.join(valid)}"
            raise ValueError(f"{where}: unknown key {key!r}{hint}")
