"""The exception tree. The classes are defined by the Rust core so that errors raised there
and here are the same classes; this module is their public home."""

from strata._core import (
    ConfigError,
    GGUFError,
    GpuError,
    ModelError,
    ProfileError,
    ProfileMismatchError,
    QuantError,
    ShapeError,
    StrataError,
)

__all__ = [
    "ConfigError",
    "GGUFError",
    "GpuError",
    "ModelError",
    "ProfileError",
    "ProfileMismatchError",
    "QuantError",
    "ShapeError",
    "StrataError",
]
