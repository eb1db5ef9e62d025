"""Varied strings for tokenizer tests: fixed hard cases plus seeded random mixes of prose, code,
CJK, emoji (ZWJ sequences, skin tones, flags), combining marks / NFD text, whitespace runs,
chat markup and random code points."""

from __future__ import annotations

import random
import unicodedata

FIXED: tuple[str, ...] = (
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "\r\n",
    "\t\t x",
    "Hello world",
    " Hello  world   ",
    "hello\n\n\n  world\t\t!",
    "It's, I'M, they'LL, we'd, you've, she's, 'tis, ''s",
    "1234567890 3.14159 -42 1e-10 0x1F",
    "def f(x):\n    return x ** 2  # square\n",
    "if (a && b) { return c; } else { x->y = z[0]; }",
    "   leading and trailing   ",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇯🇵🇺🇸 ❤️‍🔥",
    "café naïve résumé",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301",  # NFD
    "\u212b \u2126 \ufb01",  # compatibility and singleton decompositions
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|im_start|>assistant\n<think>\nreasoning\n</think>\n\nanswer<|im_end|>",
    "<|endoftext|><|endoftext|>",
    "text<|im_end|>more<|im_start|>",
    "<|im_start|",
    '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    "<|fim_prefix|>def<|fim_suffix|>x<|fim_middle|>",
    "\u0000\u0001\u001f\u007f",
    "\u200b\u200c\u200d\ufeff",
    "\U0001f600" * 20,
    "a" * 300,
    " " * 50 + "x",
    "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "Ελληνικά и русский текст",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
)

_WORDS = (
    "the", "model", "expert", "token", "Hello", "WORLD", "it's", "don't", "we'll", "qwen3",
    "GGUF", "mixture", "of", "experts", "x", "y_1", "__init__", "camelCase", "snake_case",
)  # fmt: skip
_CJK = "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
_EMOJI = ("😀", "🚀", "🎉", "👍", "👍🏻", "👨‍💻", "❤️", "🇫🇷", "🧑‍🤝‍🧑", "✨")
_SPECIAL = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")
_WS = (" ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "   \t")
_PUNCT = ".,;:!?'\"()[]{}<>/\\|@#$%^&*-+=~`"
# code point ranges for random fuzz (no surrogates)
_RANGES = (
    (0x20, 0x7E),
    (0xA0, 0x24F),
    (0x370, 0x4FF),
    (0x590, 0x6FF),
    (0x900, 0x97F),
    (0x3040, 0x30FF),
    (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3),
    (0xFF00, 0xFFEF),
    (0x1F300, 0x1FAFF),
    (0x10000, 0x1007F),
    (0xE000, 0xE0FF),  # private use
)


def _piece(rng: random.Random) -> str:
    k = rng.randrange(9)
    if k == 0:
        return rng.choice(_WORDS)
    if k == 1:
        return "".join(rng.choice(_CJK) for _ in range(rng.randrange(1, 8)))
    if k == 2:
        return rng.choice(_EMOJI)
    if k == 3:
        return rng.choice(_WS) * rng.randrange(1, 4)
    if k == 4:
        return "".join(rng.choice(_PUNCT) for _ in range(rng.randrange(1, 4)))
    if k == 5:
        return str(rng.randrange(10**8))
    if k == 6:
        return rng.choice(_SPECIAL)
    if k == 7:
        form = "NFD" if rng.random() < 0.25 else "NFC"
        return unicodedata.normalize(form, rng.choice(("é", "ü", "ñ", "Å", "ệ", "가")))
    if rng.random() < 0.1:
        # a base letter and combining marks (often not NFC)
        return "aeo"[rng.randrange(3)] + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(2))
    lo, hi = rng.choice(_RANGES)
    return "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randrange(1, 6)))


def tokenizer_cases(n_random: int = 1100, seed: int = 0) -> list[str]:
    """FIXED plus `n_random` seeded mixes (about 1,140 strings by default)."""
    rng = random.Random(seed)
    out = list(FIXED)
    for _ in range(n_random):
        out.append("".join(_piece(rng) for _ in range(rng.randrange(1, 12))))
    return out
