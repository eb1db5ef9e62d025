"""Fill-in-the-middle (code completion between a prefix and a suffix), as llama-server's
`/infill` does it: the model's FIM tokens, the prompt's layout, and the infill sampler.

- `fim_tokens`: the FIM token ids of a vocabulary — the GGUF's `tokenizer.ggml.fim_*_token_id`
  keys, else the token texts llama.cpp recognizes (Qwen's `<|fim_prefix|>`, DeepSeek's, Granite's,
  CodeLlama's, GLM-4.5's, ...; llama.cpp's `llama_vocab::load`).
- `infill_prompt`: llama-server's `format_prompt_infill` layout: the repo-level pattern
  (`[REP]myproject\\n`, then `[SEP]filename\\n` + text per extra chunk, then `[SEP]filename\\n`)
  before `[PRE]prefix[SUF]suffix[MID]` + the request's prompt after the prefix; the prefix keeps
  its last 3/4 of a batch, the suffix what is left of the batch's quarter, the extra chunks the
  context a batch and two answers leave.
- `InfillFilter`: llama.cpp's infill sampler (`llama_sampler_init_infill`) over a candidate set:
  end of generation when its share is high, tokens that are prefixes of others merged into the
  likelier one, then thresholds; the draw that follows is over the survivors' own logits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["INFILL_BATCH", "FimTokens", "InfillFilter", "fim_tokens", "infill_prompt"]

# llama-server's default logical batch (`-b 2048`): the prefix and suffix share one batch
INFILL_BATCH = 2048

# (metadata key, token texts llama.cpp recognizes) of each FIM role
_ROLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "pre": (
        "tokenizer.ggml.fim_pre_token_id",
        ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
         "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    ),
    "suf": (
        "tokenizer.ggml.fim_suf_token_id",
        ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
         "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    ),
    "mid": (
        "tokenizer.ggml.fim_mid_token_id",
        ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
         "▁<MID>", "<|code_middle|>", "<|middle|>"),
    ),
    "rep": (
        "tokenizer.ggml.fim_rep_token_id",
        ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ),
    "sep": ("tokenizer.ggml.fim_sep_token_id", ("<|file_sep|>",)),
}  # fmt: skip

# The texts llama.cpp takes for the end-of-turn token when the GGUF names none, in its order
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
    "_<EOT>", "<｜end▁of▁sentence｜>",
)  # fmt: skip

# llama-server's chunk separator where the vocabulary has no file separator
_SNIPPET = "\n\n--- snippet ---\n\n"


@dataclass(frozen=True, slots=True)
class FimTokens:
    """A vocabulary's FIM token ids; `rep` and `sep` (the repo-level pattern's) may be None."""

    pre: int
    suf: int
    mid: int
    rep: int | None
    sep: int | None


def _lookup(
    metadata: Mapping[str, Any],
    key: str,
    texts: Sequence[str],
    token_id: Callable[[str], int | None],
) -> int | None:
    """A token named by the metadata `key`, else the first of `texts` the vocabulary has."""
    v = metadata.get(key)
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return v
    for t in texts:
        i = token_id(t)
        if i is not None:
            return i
    return None


def fim_tokens(
    metadata: Mapping[str, Any], token_id: Callable[[str], int | None]
) -> FimTokens | None:
    """The FIM tokens of a model (its GGUF `metadata`, `token_id`: a token's id by its text),
    or None when it lacks a prefix, suffix or middle token (it cannot fill in)."""
    ids = {r: _lookup(metadata, *_ROLES[r], token_id) for r in _ROLES}
    pre, suf, mid = ids["pre"], ids["suf"], ids["mid"]
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, ids["rep"], ids["sep"])


def eot_token(
    metadata: Mapping[str, Any], token_id: Callable[[str], int | None], eos: int | None
) -> int | None:
    """llama.cpp's end-of-turn token: `tokenizer.ggml.eot_token_id`, else the first of its
    known texts the vocabulary has, else eos (the infill sampler's fallback)."""
    eot = _lookup(metadata, "tokenizer.ggml.eot_token_id", _EOT_TEXTS, token_id)
    return eot if eot is not None else eos


def infill_prompt(
    fim: FimTokens,
    encode: Callable[[str], list[int]],
    prefix: list[int],
    suffix: list[int],
    extra: Sequence[tuple[str, str]],
    prompt: list[int],
    *,
    n_ctx: int,
    n_predict: int = -1,
    bos: int | None = None,
    spm: bool = False,
    n_batch: int = INFILL_BATCH,
) -> list[int]:
    """The infill prompt's ids (llama-server's `format_prompt_infill`). `prefix`, `suffix` and
    `prompt` are ids already (the text before the cursor, after it, and what the client has
    typed of the middle); `extra` the (filename, text) chunks of other files; `encode` turns
    text into ids without special tokens; `n_predict`: the server-wide output limit, not the
    request's (llama-server passes its `-n`, -1 by default: the extra chunks keep
    n_ctx - n_batch + 2 tokens);
    `bos`: prepended when the model adds one; `spm`: suffix-prefix-middle order."""
    extra_ids: list[int] = []
    if fim.rep is not None:
        extra_ids += [fim.rep, *encode("myproject\n")]
    for filename, text in extra:
        if fim.sep is not None:
            extra_ids += [fim.sep, *encode(filename + "\n")]
        else:
            extra_ids += encode(_SNIPPET)
        extra_ids += encode(text)
    if fim.sep is not None:
        extra_ids += [fim.sep, *encode("filename\n")]
    # the prefix keeps its last 3/4 of a batch; the suffix what the batch's last quarter leaves
    n_prefix = min(len(prefix), 3 * (n_batch // 4))
    n_suffix = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * max(n_predict, -1)), len(extra_ids))
    pre = [fim.pre, *prefix[len(prefix) - n_prefix :], *prompt]
    suf = [fim.suf, *suffix[:n_suffix]]
    first, second = (suf, pre) if spm else (pre, suf)
    head = [bos] if bos is not None else []
    tail = extra_ids[len(extra_ids) - n_extra :] if n_extra else []
    return [*tail, *head, *first, *second, fim.mid]


class InfillFilter:
    """llama.cpp's infill sampler over a candidate set. `pieces[i]`: token i's text as
    `token_to_piece(special=false)` gives it (empty for control tokens); `eog`: end-of-
    generation ids; `eot`: the token put alone where no text candidate is left."""

    def __init__(self, pieces: Sequence[bytes], eog: frozenset[int], eot: int) -> None:
        self.pieces = pieces
        self.eog = eog
        self.eot = eot

    def __call__(
        self, cand: npt.NDArray[np.int64], logits: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """(ids [m], probabilities [m]) the draw picks from, given the candidates [n] best
        first and their logits [n] as the chain left them (temperature applied). The draw is
        over the survivors' own logits, as llama.cpp's `dist` recomputes its softmax."""
        n = cand.size
        e = np.exp(logits - logits[0])
        p = (e / e.sum()).tolist()  # [n] (the sampler's softmax, best first)
        ids = [int(t) for t in cand]
        is_eog = [t in self.eog for t in ids]
        p_eog = sum(q for q, g in zip(p, is_eog, strict=True) if g)
        p_txt = sum(q for q, g in zip(p, is_eog, strict=True) if not g)
        if 3 * p_eog * n > p_txt:  # end of generation is likely enough: only it
            keep = [i for i in range(n) if is_eog[i]]
            return self._over(cand, logits, keep)
        # a token whose text is a prefix of another's is merged into the likelier of the two,
        # pairs visited in llama.cpp's order (i0, then i1, over the candidates best first);
        # only the pairs that can merge are visited (its loop visits all n² of them)
        live = [True] * n
        ext = self._extensions([self.pieces[t] for t in ids])
        for i0 in range(n):
            for i1 in ext[i0]:
                if not live[i0]:
                    break
                if not live[i1]:
                    continue
                dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
                p[dst] += p[src]
                p[src] = 0.0
                live[src] = False
        keep = [i for i in range(n) if p[i] >= 0.2 or is_eog[i]]
        n_txt = sum(not is_eog[i] for i in keep)
        if n_txt == 0:  # no text candidate left: end of turn
            return np.array([self.eot], dtype=np.int64), np.ones(1)
        total = sum(p[i] for i in keep)
        q = {i: p[i] / total for i in keep}
        thold = 1.0 / (n_txt + 1)
        keep = [i for i in keep if q[i] >= thold or is_eog[i]]
        return self._over(cand, logits, keep)

    @staticmethod
    def _extensions(pieces: list[bytes]) -> list[list[int]]:
        """For each candidate i0 with a non-empty text, the other candidates i1 whose text
        starts with it, in increasing order (found over the texts sorted: they follow it)."""
        order = sorted(range(len(pieces)), key=pieces.__getitem__)
        out: list[list[int]] = [[] for _ in pieces]
        for k, i0 in enumerate(order):
            a = pieces[i0]
            if not a:
                continue
            j = k
            while j > 0 and pieces[order[j - 1]] == a:  # equal texts before it in the sort
                j -= 1
            while j < len(order) and pieces[order[j]].startswith(a):
                if order[j] != i0:
                    out[i0].append(order[j])
                j += 1
            out[i0].sort()
        return out

    @staticmethod
    def _over(
        cand: npt.NDArray[np.int64], logits: npt.NDArray[np.float64], keep: list[int]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        idx = np.asarray(keep, dtype=np.int64)
        v = logits[idx]
        w = np.exp(v - v.max())
        return cand[idx], w / w.sum()


@functools.lru_cache(maxsize=4)
def infill_filter(vocab: Any) -> InfillFilter:
    """The filter of a `strata.constraints.Vocabulary` (token pieces, end-of-generation ids,
    its `eot_id` where it has one), built once per vocabulary (~0.1 s for 152K tokens)."""
    n = vocab.n_vocab
    pieces = [b"" if vocab.is_special(i) else bytes(vocab.token_bytes(i)) for i in range(n)]
    eog = frozenset(vocab.eog_ids)
    eot = getattr(vocab, "eot_id", None)
    if eot is None:
        eot = min(eog) if eog else 0
    return InfillFilter(pieces, eog, eot)
