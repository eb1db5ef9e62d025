"""The gpt-4o (o200k, gpt-oss) pre-tokenizer against llama.cpp's tokenizer (llama-cpp-python,
vocab_only): a byte-level BPE trained over that split (so that its merges span what the qwen2
split would cut: digit triples, attached contractions, `/` and newlines after punctuation),
written with `tokenizer.ggml.pre = "gpt-4o"`; ids identical on the tokenizer test cases but
the inputs that are not NFC (HF normalizes them, llama.cpp does not)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from strata import modelgen, vocabgen
from strata._corpus import corpus_lines
from strata.gguf import GGUFFile
from strata.modelgen import ModelSpec
from strata.tokenizer import GPT4O_PRETOKENIZER_RE, Tokenizer
from test_tokenizer import CASES, compare_with_llama


def vocab_file(path: Path, pre: str) -> Path:
    _, tokens, merges = vocabgen.train_bpe(
        [*corpus_lines(), *CASES], 3000, split_re=GPT4O_PRETOKENIZER_RE
    )
    v = dataclasses.replace(vocabgen.chatml_vocab(tokens, merges, len(tokens) + 16), pre=pre)
    spec = dataclasses.replace(ModelSpec.tiny(), n_vocab=len(v))
    return modelgen.write_vocab_only(path, v, spec)


def tokenizer(path: Path) -> Tokenizer:
    with GGUFFile(path) as g:
        return Tokenizer.from_metadata(g.metadata)


@pytest.fixture(scope="module")
def gpt4o(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vocab_file(tmp_path_factory.mktemp("gpt4o") / "vocab.gguf", "gpt-4o")


def test_gpt4o_ids_identical_to_llama_cpp(gpt4o: Path) -> None:
    classes = compare_with_llama(tokenizer(gpt4o), gpt4o)
    assert classes["other"] == 0


def test_the_split_matters_on_this_vocab(gpt4o: Path, tmp_path: Path) -> None:
    """The same vocabulary read with the qwen2 split gives other ids on many cases: the check
    above tells the two patterns apart."""
    ours, qwen2 = tokenizer(gpt4o), tokenizer(vocab_file(tmp_path / "q.gguf", "qwen2"))
    differ = sum(ours.encode(s) != qwen2.encode(s) for s in CASES)
    print(f"{differ} of {len(CASES)} cases tokenize differently under the qwen2 split")
    assert differ >= len(CASES) // 10
