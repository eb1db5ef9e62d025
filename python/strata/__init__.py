"""Strata: run Mixture-of-Experts GGUF models larger than VRAM at interactive speed."""

from strata._core import __version__
from strata.errors import GGUFError, StrataError

__all__ = ["GGUFError", "StrataError", "__version__"]
