"""Strata: run Mixture-of-Experts GGUF models larger than VRAM at interactive speed."""

from strata._core import __version__
from strata.errors import GGUFError, StrataError
from strata.llm import LLM

__all__ = ["LLM", "GGUFError", "StrataError", "__version__"]
