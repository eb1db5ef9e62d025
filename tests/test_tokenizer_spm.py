"""SentencePiece vocabularies (`tokenizer.ggml.model` = "llama": Mixtral, ERNIE 4.5) against
llama.cpp's tokenizer (llama-cpp-python, vocab_only): a SentencePiece BPE model trained by the
`sentencepiece` trainer on the project corpus and the tokenizer cases (byte fallback, digits
split, ChatML markers as user-defined pieces), written as llama.cpp's converter writes one.
Ids identical on every case, with and without the space prefix; each token's bytes as
llama.cpp's piece."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from strata import modelgen, vocabgen
from strata._corpus import corpus_lines
from strata.errors import ModelError
from strata.gguf import GGUFFile
from strata.modelgen import ModelSpec
from strata.tokenizer import Tokenizer
from test_tokenizer import CASES

SPECIALS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


def vocab_file(path: Path, add_space_prefix: bool = True, written: bool | None = None) -> Path:
    """The trained vocabulary (with or without the space prefix) in a GGUF whose
    add_space_prefix is `written` (default: as trained)."""
    v = vocabgen.train_spm([*corpus_lines(), *CASES[:400]], 3000, SPECIALS, add_space_prefix)
    if written is not None:
        v = dataclasses.replace(v, add_space_prefix=written)
    spec = dataclasses.replace(ModelSpec.tiny(), n_vocab=len(v))
    return modelgen.write_vocab_only(path, v, spec)  # type: ignore[arg-type]


def tokenizer(path: Path) -> Tokenizer:
    with GGUFFile(path) as g:
        return Tokenizer.from_metadata(g.metadata)


def llama(path: Path) -> object:
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def spm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vocab_file(tmp_path_factory.mktemp("spm") / "vocab.gguf")


def mismatches(path: Path, cases: list[str]) -> list[str]:
    ours, ref = tokenizer(path), llama(path)
    bad = []
    for s in cases:
        want = ref.tokenize(s.encode("utf-8"), add_bos=False, special=True)  # type: ignore[attr-defined]
        if ours.encode(s) != want:
            bad.append(s)
            if len(bad) <= 5:
                print("mismatch:", repr(s), ours.encode(s), want)
    return bad


def test_spm_ids_identical_to_llama_cpp(spm: Path) -> None:
    cases = [*CASES, "", " ", "  lead", "trail  ", "a<|im_start|>b", "<|im_end|> x", "\n\n"]
    assert mismatches(spm, cases) == []


def test_spm_without_space_prefix_identical_to_llama_cpp(tmp_path: Path) -> None:
    path = vocab_file(tmp_path / "noprefix.gguf", add_space_prefix=False)
    assert mismatches(path, CASES[:300]) == []


def test_spm_bos_and_pieces_as_llama_cpp(spm: Path) -> None:
    import llama_cpp

    ours, ref = tokenizer(spm), llama(spm)
    text = "Hello world, 1234 émigré 🙂\n\tend"
    want = ref.tokenize(text.encode(), add_bos=True, special=True)  # type: ignore[attr-defined]
    assert ours.encode(text, add_special=True) == want
    assert want[0] == ours.bos_id
    vocab = llama_cpp.llama_model_get_vocab(ref._model.model)  # type: ignore[attr-defined]
    buf = (llama_cpp.ctypes.c_char * 64)()
    for i in range(ours.n_vocab):
        n = llama_cpp.llama_token_to_piece(vocab, i, buf, len(buf), 0, True)
        assert ours.token_bytes(i) == bytes(buf[:n]), (i, ours.token_text(i))
    # the text comes back (the space prefix stays, as llama.cpp's pieces give it)
    assert ours.decode(want[1:]) == " " + text


def test_spm_vocab_uses_its_merges_and_bytes(spm: Path) -> None:
    """The cases exercise what the check above is about: multi-character merges, byte
    fallback for characters the vocabulary lacks, and user-defined pieces."""
    tok = tokenizer(spm)
    ids = [i for s in CASES for i in tok.encode(s)]
    texts = [tok.token_text(i) for i in ids]
    assert sum(len(t) > 3 for t in texts) > 1000
    assert sum(t.startswith("<0x") for t in texts) > 100
    assert any(t == "<|im_start|>" for t in texts)


def test_spm_without_scores_is_refused(spm: Path) -> None:
    with GGUFFile(spm) as g:
        meta = dict(g.metadata)
    for key, value, match in [
        ("tokenizer.ggml.scores", None, "no tokenizer.ggml.scores"),
        ("tokenizer.ggml.scores", [0.0], "scores for"),
        ("tokenizer.ggml.scores", ["x"] * len(meta["tokenizer.ggml.tokens"]), "not a number"),
    ]:
        bad = {k: v for k, v in meta.items() if k != key}
        with pytest.raises(ModelError, match=match):
            Tokenizer.from_metadata(bad if value is None else {**bad, key: value})


def test_server_prompts_start_with_bos_as_llama_server(spm: Path) -> None:
    """The server's prompt ids (chat, /completion text, /infill) are llama-server's: its
    tokenization with add_special, so BOS first, and one BOS where the text renders it."""
    from strata.server.tokenizing import RealTokenizer, ToyTokenizer

    with GGUFFile(spm) as g:
        tok = RealTokenizer(dict(g.metadata))
    ref = llama(spm)
    for text in ["Hello there", "<|im_start|>user\nhi<|im_end|>", "<s>already led"]:
        want = ref.tokenize(text.encode(), add_bos=True, special=True)  # type: ignore[attr-defined]
        if want[1:2] == [tok.bos_id]:
            want = want[1:]  # llama-server would lead with two; one is kept here
        assert tok.with_bos(tok.encode(text, True)) == want
    assert ToyTokenizer().with_bos([5, 6]) == [5, 6]  # a vocabulary without add_bos


def test_tokenizer_with_bos(spm: Path) -> None:
    tok = tokenizer(spm)
    assert tok.adds_bos and tok.bos_id is not None
    ids = tok.encode("Hello")
    assert tok.with_bos(ids) == [tok.bos_id, *ids]
    assert tok.with_bos([tok.bos_id, *ids]) == [tok.bos_id, *ids]


def test_spm_eog_ids_as_llama_cpp(spm: Path) -> None:
    from test_tokenizer import llama_eog

    assert tokenizer(spm).eog_ids == llama_eog(spm)


def test_spm_continuation_is_llama_cpps_without_the_prefix(spm: Path, tmp_path: Path) -> None:
    """`encode_continuation` (text continuing a sequence: what llguidance tokenizes forced
    text with) is llama.cpp's tokenization of the same vocabulary with add_space_prefix off."""
    flipped = vocab_file(tmp_path / "flipped.gguf", written=False)
    ours, ref = tokenizer(spm), llama(flipped)
    for s in CASES[:300]:
        want = ref.tokenize(s.encode("utf-8"), add_bos=False, special=True)  # type: ignore[attr-defined]
        assert ours.encode_continuation(s) == want, s
    assert ours.encode("{") != ours.encode_continuation("{")


def test_spm_constrained_json_is_valid(spm: Path) -> None:
    """A JSON schema grammar over the SentencePiece vocabulary (llguidance's mask): random
    logits masked step by step give documents of the schema (with the space prefix in
    llguidance's tokenizing of forced text, the mask allowed only " {" and then nothing)."""
    import json

    import jsonschema
    import numpy as np
    from strata import constraints as C

    tok = tokenizer(spm)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    lt = C.vocabulary_tokenizer(tok)
    grammar = C.json_schema_grammar(schema)
    rng = np.random.default_rng(0)
    for _ in range(5):
        proc = C.GrammarProcessor(lt, grammar, tok.n_vocab)
        out: list[int] = []
        while not proc.done() and len(out) < 200:
            x = rng.standard_normal(tok.n_vocab).astype(np.float32)
            proc(x)
            out.append(int(np.argmax(x)))
            proc.accept(out[-1])
        assert proc.error is None and proc.done()
        jsonschema.validate(json.loads(tok.decode(out, skip_special=True)), schema)


def test_tokenize_route_add_special_as_llama_server(spm: Path, tmp_path: Path) -> None:
    """/tokenize's `add_special` (llama-server's; default off) leads the ids with BOS on a
    vocabulary that asks for one, as llama.cpp's tokenizer with add_special."""
    from server_harness import Server
    from strata import modelgen
    from strata.modelgen import ModelSpec

    v = vocabgen.train_spm([*corpus_lines(), *CASES[:400]], 3000, SPECIALS)
    spec = dataclasses.replace(ModelSpec.micro(n_embd=64, n_ff_exp=64), n_vocab=len(v))
    path = modelgen.write_qwen3moe(tmp_path / "spm-model.gguf", spec, vocab=v)  # type: ignore[arg-type]
    ref = llama(spm)
    s = Server(engine="llm", model=path, n_ctx=256)
    try:
        for add in (False, True):
            r = s.http.post("/tokenize", json={"content": "Hello world", "add_special": add})
            want = ref.tokenize(b"Hello world", add_bos=add, special=True)  # type: ignore[attr-defined]
            assert r.json()["tokens"] == want
        # the served prompt is llama-server's: BOS, then the text's pieces
        c = s.http.post("/completion", json={"prompt": "Hello world", "n_predict": 4}).json()
        assert c["tokens_evaluated"] == len(ref.tokenize(b"Hello world", add_bos=True))  # type: ignore[attr-defined]
        assert isinstance(c["content"], str) and c["tokens_predicted"] >= 1
    finally:
        s.stop()


def test_fim_prompt_places_bos_as_llama_server() -> None:
    """A fill-in-the-middle prompt of a model that asks for BOS: after the other files'
    chunks, before the FIM prefix (llama-server's `format_prompt_infill`), once."""
    import asyncio
    import types

    from strata.infill import FimTokens
    from strata.server import routes

    class Tok:
        def __init__(self) -> None:
            self.fim = FimTokens(pre=10, suf=11, mid=12, rep=None, sep=13)
            self.prompt_bos = 1
            self.n_vocab = 100

        def encode(self, s: str, special: bool) -> list[int]:
            return [50 + len(s) % 10]

    config = types.SimpleNamespace(n_ctx_seq=4096, n_predict=-1, spm_infill=False)
    st, client = types.SimpleNamespace(config=config), types.SimpleNamespace(loaded=None)
    got = asyncio.run(routes.fim_prompt(st, client, Tok(), [20, 21], [30], [("a.py", "x=1")]))  # type: ignore[arg-type]
    assert got == [13, 55, 53, 13, 59, 1, 10, 20, 21, 11, 30, 12]


def test_spm_defaults_and_tied_scores_as_llama_cpp(spm: Path, tmp_path: Path) -> None:
    """A SentencePiece file without add_bos_token / bos / eos / unknown ids takes llama.cpp's
    defaults (BOS 1 added, EOS 2, unknown 0); pieces that share scores are refused (llama.cpp
    merges those leftmost first), not tokenized otherwise."""
    with GGUFFile(spm) as g:
        meta = dict(g.metadata)
    keys = ("add_bos_token", "bos_token_id", "eos_token_id", "unknown_token_id")
    bare = {k: v for k, v in meta.items() if k.removeprefix("tokenizer.ggml.") not in keys}
    tok = Tokenizer.from_metadata(bare)
    assert (tok.adds_bos, tok.bos_id, tok.eos_id) == (True, 1, 2)
    assert tok.with_bos(tok.encode("Hello")) == llama(spm).tokenize(b"Hello", add_bos=True)  # type: ignore[attr-defined]
    tied = {**meta, "tokenizer.ggml.scores": [-1000.0] * len(meta["tokenizer.ggml.scores"])}
    with pytest.raises(ModelError, match="share scores"):
        Tokenizer.from_metadata(tied)
