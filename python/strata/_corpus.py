"""A small built-in, varied text corpus for training the test models' BPE vocabulary.

Prose, code, markup, numbers, CJK, Cyrillic, Arabic, emoji and whitespace runs, so the trained
vocabulary has merges in every script the tokenizer tests exercise. Written for this project.
"""

from __future__ import annotations

CORPUS: tuple[str, ...] = (
    # English prose
    "The quick brown fox jumps over the lazy dog. The dog did not seem to mind at all.",
    "Mixture-of-experts models route every token to a few experts out of many; the rest idle.",
    "When the model is larger than the memory of the graphics card, the hot experts stay in "
    "VRAM and the cold ones are computed on the CPU, in parallel, from RAM.",
    "It's a long way to the top if you want to rock and roll, she said; they'll see, we'd go.",
    "I'm sure you've heard it before: there is no such thing as a free lunch.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.",
    "Every morning he rowed out before dawn, and every evening he came back with his nets full.",
    "Questions? Answers! Numbers like 3.14159, 2.71828, 1,000,000 and 42 appear everywhere.",
    "The meeting is at 10:30 on 2024-06-01; bring 3 copies of the report (pages 1-12).",
    "Hello, world! How are you today? I am fine, thank you. And you?",
    "Tokenizers split text into pieces; byte-level BPE never fails on unknown characters.",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "In 1969, humans first walked on the Moon. Apollo 11 landed in the Sea of Tranquility.",
    "Machine learning, deep learning, reinforcement learning: all of them need lots of data.",
    "Please write a short poem about the autumn leaves falling in the quiet forest.",
    "Sure! Here is a short poem:\n\nGolden leaves drift down,\nwhispering to the cold ground,\n"
    "autumn says goodbye.",
    "THE END. That's all, folks!!! ... or is it??? -- Maybe not; stay tuned.",
    # Chat markup
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?"
    "<|im_end|>\n<|im_start|>assistant\n<think>\nSimple arithmetic.\n</think>\n\n2 + 2 = 4."
    "<|im_end|>\n",
    "<|im_start|>user\nTranslate 'good morning' into French.<|im_end|>\n<|im_start|>assistant\n"
    "Bonjour !<|im_end|>\n",
    # Code
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\n\nfor i in range(10):\n    print(i, fibonacci(i))\n",
    "import numpy as np\n\nx = np.zeros((4, 4), dtype=np.float32)\nx[0, :] = 1.0\n"
    "print(x.sum(axis=0))  # [1. 1. 1. 1.]\n",
    "class Pool:\n    def __init__(self, threads):\n        self.threads = threads\n"
    "        self.queue = []\n\n    def submit(self, job):\n        self.queue.append(job)\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n"
    '    println!("{:?}", v);\n}\n',
    "#include <stdio.h>\n\nint main(void) {\n\tfor (int i = 0; i < 3; ++i) {\n"
    '\t\tprintf("%d\\n", i);\n\t}\n\treturn 0;\n}\n',
    "SELECT name, COUNT(*) AS n FROM users WHERE age >= 18 GROUP BY name ORDER BY n DESC;",
    "const add = (a, b) => a + b;\nconsole.log(add(2, 3)); // 5\nexport default add;\n",
    '{"model": "qwen3", "messages": [{"role": "user", "content": "hi"}], "stream": true}',
    '<html>\n  <body>\n    <p class="note">Hello &amp; welcome</p>\n  </body>\n</html>\n',
    "$ cargo test --release && pytest -q tests/ 2>&1 | tee log.txt\n",
    "    \n\n\t\t   trailing spaces   \n\r\n  indented\n        deeper\n",
    # Other scripts
    "机器学习是人工智能的一个分支。专家混合模型把每个词元路由到少数几个专家。",
    "今天天气很好，我们去公园散步吧。你好，世界！谢谢你的帮助。",
    "東京は日本の首都です。ひらがな、カタカナ、漢字を使います。こんにちは世界。",
    "한국어는 한글로 씁니다. 안녕하세요, 만나서 반갑습니다.",
    "Съешь же ещё этих мягких французских булок, да выпей чаю. Привет, мир!",
    "Ελληνικά: Καλημέρα κόσμε. Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "مرحبا بالعالم. اللغة العربية تكتب من اليمين إلى اليسار.",
    "नमस्ते दुनिया। यह एक परीक्षण वाक्य है।",
    "Français : où est la bibliothèque ? Déjà vu, naïve café, élève, garçon.",
    "Deutsch: Grüße aus München! Die Straße ist schön, Übung macht den Meister.",
    "Español: ¿Dónde está el baño? ¡Qué día más bonito! Mañana será otro día.",
    "Tiếng Việt: Xin chào thế giới. Cảm ơn bạn rất nhiều.",
    # Emoji and symbols
    "Emoji: 😀 😃 😄 😁 🎉 🚀 ❤️ 👍🏽 👨‍👩‍👧‍👦 🇯🇵 🇺🇸 ✨ 🔥 💯",
    "Math: ∑ᵢ xᵢ² ≤ ∞, ∀ε>0 ∃δ>0, α β γ δ π ≈ 3.14, √2, ∫₀¹ f(x) dx, → ⇒ ≠ ±",
    "Symbols: © ® ™ € £ ¥ § ¶ • … « » “quotes” ‘single’ — en–dash",
    "Box drawing: ┌──┐ │  │ └──┘ and arrows ← ↑ → ↓ and blocks ░▒▓█",
)


class _SplitMix64:
    """A tiny fixed PRNG, so the synthetic text never depends on library versions."""

    def __init__(self, seed: int) -> None:
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def below(self, n: int) -> int:
        self.s = (self.s + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return (z ^ (z >> 31)) % n


_ONSETS = (
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "st",
    "tr",
    "ch",
    "sh",
    "th",
    "pl",
    "gr",
    "br",
    "",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "ng", "st", "ck")
_CJK = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着"
    "去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主"
    "行方又如前所本见经头面公同三已老从动两长"
)
_PUNCT = (".", ".", ",", "!", "?", ";", ":")


def _word(rng: _SplitMix64) -> str:
    n = 1 + rng.below(3)
    parts = [_ONSETS[rng.below(len(_ONSETS))] + _VOWELS[rng.below(len(_VOWELS))] for _ in range(n)]
    return "".join(parts) + _CODAS[rng.below(len(_CODAS))]


def synthetic_lines(n: int, seed: int = 1234) -> list[str]:
    """`n` lines of deterministic pseudo-text: made-up words with punctuation and numbers,
    snake_case code lines and CJK runs, so larger vocabularies have something to merge."""
    rng = _SplitMix64(seed)
    lines = []
    for i in range(n):
        kind = i % 4
        if kind == 3:
            lines.append("".join(_CJK[rng.below(len(_CJK))] for _ in range(8 + rng.below(24))))
        elif kind == 2:
            name = "_".join(_word(rng) for _ in range(1 + rng.below(3)))
            arg = _word(rng)
            lines.append(f"def {name}({arg}):\n    return {arg} * {rng.below(1000)}\n")
        else:
            words = [_word(rng) for _ in range(5 + rng.below(12))]
            words[0] = words[0].capitalize()
            lines.append(" ".join(words) + _PUNCT[rng.below(len(_PUNCT))])
    return lines


def corpus_lines(repeat: int = 2, synthetic: int = 1200) -> list[str]:
    """The corpus, each entry repeated `repeat` times so its pairs clear min_frequency, then
    `synthetic` lines of generated text."""
    return [line for _ in range(repeat) for line in CORPUS] + synthetic_lines(synthetic)
