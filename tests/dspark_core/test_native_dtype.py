"""The dtype `auto` resolves to: bf16 only where the CPU's own flags say bf16 matmuls are native."""

from __future__ import annotations

from dspark_core.native_dtype import cpu_flags, cpu_has_native_bf16, fast_dtype

SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\nbogomips\t: 4000\n"
SKYLAKE_X = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\n"


def test_flags_decide_and_avx512_alone_is_not_native_bf16():
    assert cpu_has_native_bf16(cpu_flags(SAPPHIRE_RAPIDS), "AVX512")
    assert not cpu_has_native_bf16(cpu_flags(SKYLAKE_X), "AVX512")  # torch says AVX512 here too
    assert cpu_flags("no flags line here") == frozenset()
    assert cpu_has_native_bf16(frozenset(), "AMX") and not cpu_has_native_bf16(frozenset(), "AVX512")


def test_fast_dtype_names_a_torch_dtype():
    import torch

    assert fast_dtype() in ("bfloat16", "float32") and isinstance(getattr(torch, fast_dtype()), torch.dtype)
