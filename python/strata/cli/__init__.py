"""Command-line tools (`strata-fill`)."""
