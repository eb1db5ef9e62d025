"""`uvicorn strata.app:app`: the server, configured from STRATA_* variables / STRATA_CONFIG."""

from strata.server.app import create_app

app = create_app()
