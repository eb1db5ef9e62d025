"""The engine: its own process (core, scheduler, backend), the protocol to it, and the server's
client for it. Layering: the server imports `client` and `protocol`, never `core`/`backend`."""
