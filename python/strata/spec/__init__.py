"""Speculative decoding: drafters (`drafters`), window verification (`verify`), the adaptive
window (`control`) and the scheduler's side of it (`speculator`). `make_speculator` builds
what the `spec` settings ask for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strata.config import Config
from strata.spec.drafters import Draft, Drafter, DraftRequest, open_drafter, propose
from strata.spec.speculator import Speculator

__all__ = ["Draft", "DraftRequest", "Drafter", "Speculator", "make_speculator", "propose"]


def make_speculator(config: Config, backend: Any) -> Speculator | None:
    """The speculator of `config.spec` over `backend` (None when off); ConfigError when the
    drafter cannot run (no MTP layer, a draft of another vocabulary, …)."""
    if config.spec == "off":
        return None
    kind = config.spec
    llm = getattr(backend, "llm", None)
    model = getattr(llm, "model", None)
    if kind == "auto":  # a draft model when named, else the model's own MTP layer, else n-grams
        mtp = bool(getattr(model, "has_mtp", False))
        kind = "draft" if config.spec_draft_model else "mtp" if mtp else "ngram"
    target = str(getattr(backend, "path", "")) if llm is not None else None
    draft = config.spec_draft_model
    if kind == "draft" and not draft and target:
        from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

        if Path(target).resolve() == modelgen.shipped_model_path("default").resolve():
            draft = str(modelgen.shipped_model_path("draft"))  # the shipped default's own
    drafter = open_drafter(
        kind,
        target_path=target,
        target_metadata=getattr(llm, "metadata", None),
        draft_path=draft,
        target_model=model,
        n_slots=backend.max_slots,
        n_ctx=backend.n_ctx_seq,
        p_min=config.spec_p_min,
        threads=1,  # see ModelDrafter: no pool threads of its own beside the model's
    )
    return Speculator(drafter, config.spec_min, config.spec_max, config.spec_adaptive)
