"""What the server holds for its lifetime: settings, tokenizer, engine client, metrics.

`startup()` resolves the model (the embedded default model is built on first start), loads
the tokenizer (never the weights) and starts the engine process; until it is done `/health`
answers 503. `shutdown()` drains: new requests get 503 while running ones finish (up to
`drain_timeout_s`), then the engine is stopped.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path

from strata.config import Config
from strata.engine.client import EngineClient
from strata.metrics import Metrics
from strata.sampling import SamplingParams, request_defaults
from strata.sampling_chain import default_chain
from strata.server.openai_types import APIError
from strata.server.tokenizing import ServerTokenizer, load_tokenizer

log = logging.getLogger("strata.server")


def _resolve_model(config: Config) -> Config:
    if config.engine == "fake" or config.model:
        return config
    from strata import modelgen  # type: ignore[attr-defined, unused-ignore]

    path = modelgen.shipped_model_path("default")
    return dataclasses.replace(config, model=str(path))


class ServerState:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.tokenizer: ServerTokenizer | None = None
        # the sampling a request starts from (settings, else the model's recommendations)
        self.defaults = SamplingParams()
        # the sampler chain of a request that names none (None: llama.cpp's default one)
        self.chain: list[str] | str | None = None
        self.client: EngineClient | None = None
        self.metrics = Metrics(lambda: self.client)
        self.status = "loading"  # loading → ready | failed; draining at shutdown
        self.error = ""
        self.created = int(time.time())
        self.model_id = self._model_id(config)
        self.default_model = config.engine == "llm" and not config.model
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _model_id(config: Config) -> str:
        if config.served_model_name:
            return config.served_model_name
        if config.engine == "fake":
            return "strata-fake"
        if config.model:
            name = Path(config.model).name
            return name[: -len(".gguf")] if name.endswith(".gguf") else name
        return "strata-default"

    # -- lifecycle ---------------------------------------------------------------------------

    def begin(self) -> None:
        self._task = asyncio.create_task(self.startup())

    async def startup(self) -> None:
        try:
            config = await asyncio.to_thread(_resolve_model, self.config)
            self.tokenizer = await asyncio.to_thread(load_tokenizer, config)
            self.defaults, notes = request_defaults(
                self.tokenizer.sampling_metadata, config.sampling_settings()
            )
            self.chain, more = default_chain(
                self.tokenizer.sampling_metadata, config.samplers, self.defaults
            )
            for note in notes + more:
                log.warning("the model's sampling recommendation %s", note)
            self.client = EngineClient(config)
            self.config = config
            await self.client.start()
        except Exception as e:  # shown on /health and /v1/status; the server stays up
            log.exception("startup failed")
            self.status, self.error = "failed", f"{type(e).__name__}: {e}"
            return
        if self.client.state == "failed":
            self.status, self.error = "failed", self.client.error
            log.error("engine failed to load: %s", self.error)
            return
        if self.status == "loading":
            self.status = "ready"

    async def shutdown(self) -> None:
        await self.drain()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self.client is not None:
            await self.client.close()

    async def drain(self) -> None:
        if self.status == "draining":
            return
        self.status = "draining"
        if self.client is not None:
            done = await self.client.drain(self.config.drain_timeout_s)
            if not done:
                log.warning("drain timed out after %.0f s", self.config.drain_timeout_s)
                self.client.abort_all("server shutting down (drain timeout)")

    # -- checks used by the routes -----------------------------------------------------------

    def ready(self) -> tuple[EngineClient, ServerTokenizer]:
        """The engine and tokenizer, or the 503 that says why not."""
        if self.status == "draining":
            raise APIError(503, "server is shutting down", code="shutting_down")
        if self.status == "failed":
            raise APIError(503, f"model failed to load: {self.error}", code="load_failed")
        if self.client is None or self.tokenizer is None or self.status != "ready":
            raise APIError(503, "model is loading", code="loading", headers={"Retry-After": "2"})
        if self.client.state == "failed":
            raise APIError(503, f"engine failed: {self.client.error}", code="engine_failed")
        return self.client, self.tokenizer

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise APIError(
                404,
                f"model {model!r} not found; this server serves {self.model_id!r}",
                param="model",
                code="model_not_found",
            )
