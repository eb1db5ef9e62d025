"""`strata generate --model PATH "prompt"`: stream a completion to the terminal.
`strata setup MODEL`: write a config for this machine and model (`strata.cli.setup`).
(`python -m strata …` is the same.)"""

from __future__ import annotations

import argparse
import sys

from strata.config import Config
from strata.errors import StrataError


def _generate(ns: argparse.Namespace) -> int:
    import dataclasses

    from strata import modelgen
    from strata.llm import LLM

    cfg = Config.from_args(ns)
    if not cfg.model:  # as the server: the embedded default model
        cfg = dataclasses.replace(cfg, model=str(modelgen.shipped_model_path("default")))
    llm = LLM.from_config(cfg)
    prompt: object = ns.prompt
    if ns.chat:
        prompt = [{"role": "user", "content": ns.prompt}]
    reason = None
    for ev in llm.generate(
        prompt,  # type: ignore[arg-type]
        max_tokens=ns.max_tokens,
        temperature=ns.temperature,
        top_k=ns.top_k,
        top_p=ns.top_p,
        min_p=ns.min_p,
        seed=ns.seed,
        repeat_penalty=ns.repeat_penalty,
        stop=ns.stop or None,
    ):
        sys.stdout.write(ev.text)
        sys.stdout.flush()
        reason = ev.finish_reason
    print(f"\n[finish: {reason}]", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["setup"]:  # its own parser (strata setup --help)
        from strata.cli.setup import main as setup

        return setup(args[1:])
    parser = argparse.ArgumentParser(prog="strata")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="write a config for this machine and a model (setup --help)")
    g = sub.add_parser("generate", help="stream a completion of PROMPT")
    g.add_argument("prompt")
    Config.add_arguments(g, only=("model", "n_ctx", "kv_type", "prefill_chunk"))
    g.add_argument("--chat", action="store_true", help="wrap the prompt as a user message")
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=40)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--min-p", type=float, default=0.05)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--repeat-penalty", type=float, default=1.0)
    g.add_argument("--stop", action="append", default=[])
    ns = parser.parse_args(args)
    try:
        return _generate(ns)
    except StrataError as e:  # a setting or the model refused (ConfigError, GGUFError, ...)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
