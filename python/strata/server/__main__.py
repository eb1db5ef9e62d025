"""`python -m strata.server [--flags]`: uvicorn on the host/port of the one Config (flags,
STRATA_* variables, STRATA_CONFIG file). Without an API key only a loopback address is bound."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

import uvicorn

from strata.config import Config
from strata.errors import ConfigError
from strata.server.app import create_app
from strata.server.llama_flags import add_llama_flags, apply_llama_flags


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parser() -> argparse.ArgumentParser:
    """Every setting as `--flag`, and llama-server's names where they mean the same."""
    p = argparse.ArgumentParser(prog="python -m strata.server", description=__doc__)
    p.add_argument("--config", help="TOML config file (also STRATA_CONFIG)")
    Config.add_arguments(p, llama=True)
    add_llama_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    try:
        apply_llama_flags(ns)
        config = Config.from_args(ns, config_file=ns.config)
        if not config.api_key and not _loopback(config.host):
            raise ConfigError(
                f"host: binding {config.host} needs an API key (STRATA_API_KEY); "
                "without one the server binds loopback only"
            )
        if config.model and config.engine != "fake" and not Path(config.model).is_file():
            raise ConfigError(f"model {config.model}: no such file")
    except ConfigError as e:
        print(f"strata: {e}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(config), host=config.host, port=config.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
