"""The SentencePiece vocabulary of a GGUF (`tokenizer.ggml.model` = "llama"), as llama.cpp runs
it (`llm_tokenizer_spm`): Mixtral, ERNIE 4.5 and the other SentencePiece-BPE models.

llama.cpp's algorithm: spaces become U+2581 ("▁"); with `add_space_prefix` (default on) each
run of text that starts the input or follows a special token gets a leading "▁"; the text's
characters are the first symbols; repeatedly the adjacent pair whose concatenation is a
vocabulary entry of the highest score is merged (equal scores: the leftmost pair); what is left
that is no entry is spelled with the byte tokens `<0xXX>` (or the unknown token).

Built on the `tokenizers` BPE model: its merges are every split of every entry into two
entries, ranked by the entry's score (highest first), so that "the best-scoring merge present"
is "the lowest-ranked merge present"; `byte_fallback` spells unknown characters as `<0xXX>`;
the normalizer adds the "▁" prefix to each run of text between added (special) tokens, as
llama.cpp does after each special token. The tokenizer oracle test checks it against
llama.cpp's own tokenizer (tests/test_tokenizer_spm.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from strata.errors import ModelError

SPACE = "\u2581"  # "▁", SentencePiece's space
# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def merges_by_score(vocab: dict[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Every (left, right) with left + right, left and right all entries, ranked by the score
    of left + right (highest first; equal scores by id, then by split point)."""
    ranked: list[tuple[float, int, int, str, str]] = []
    for text, i in vocab.items():
        for k in range(1, len(text)):
            left, right = text[:k], text[k:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, k, left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def hf_model(
    tokens: Sequence[str],
    types: Sequence[int],
    scores: Sequence[float] | None,
    vocab: dict[str, int],
    add_space_prefix: bool,
    unk_id: int | None,
) -> Any:
    """The `tokenizers.Tokenizer` of a SentencePiece vocabulary (added tokens not yet set)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    n = len(tokens)
    if scores is None:
        raise ModelError("tokenizer: a SentencePiece vocabulary needs tokenizer.ggml.scores")
    if len(scores) != n:
        raise ModelError(f"tokenizer: {len(scores)} scores for {n} tokens (they must match)")
    for s in scores:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or s != s:
            raise ModelError(f"tokenizer.ggml.scores: {s!r} is not a number")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < n else None
    # only entries the merges may produce: normal and user-defined text (llama.cpp looks any
    # entry up, but control, byte and unused entries are not spelled by characters)
    mergeable = {t: i for t, i in vocab.items() if types[i] in (NORMAL, USER_DEFINED)}
    # llama.cpp merges equal scores leftmost first, which ranked merges cannot say: refused
    multi = [float(scores[i]) for t, i in mergeable.items() if len(t) > 1 and types[i] == NORMAL]
    if len(set(multi)) < len(multi):
        raise ModelError(
            "tokenizer: SentencePiece pieces share scores (llama.cpp then merges the leftmost "
            "pair first, which Strata's tokenizer does not do yet)"
        )
    try:
        model = models.BPE(
            vocab=vocab,
            merges=merges_by_score(mergeable, scores),
            unk_token=unk,
            byte_fallback=True,
            fuse_unk=False,
        )
    except Exception as e:  # tokenizers raises plain Exception on bad merges
        raise ModelError(f"tokenizer: cannot build the SentencePiece model: {e}") from None
    hf = HFTokenizer(model)
    hf.normalizer = normalizer(add_space_prefix)
    return hf


def normalizer(add_space_prefix: bool) -> Any:
    """Spaces as "▁", with the "▁" prefix of each run of text (between added tokens) where
    `add_space_prefix`."""
    from tokenizers import normalizers

    steps: list[Any] = [normalizers.Replace(" ", SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(SPACE))
    return normalizers.Sequence(steps)


def piece(text: str, ty: int) -> bytes:
    """The bytes a token decodes to: "▁" is a space in normal entries, `<0xXX>` is its byte,
    control, unknown and user-defined entries are their text, unused ones nothing."""
    if ty == NORMAL:
        return text.replace(SPACE, " ").encode("utf-8")
    if ty == BYTE:
        if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        raise ModelError(f"tokenizer: byte token {text!r} is not <0xXX>")
    if ty in (CONTROL, USER_DEFINED, UNKNOWN):
        return text.encode("utf-8")
    return b""
