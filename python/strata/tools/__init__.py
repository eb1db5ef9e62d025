"""Command-line tools shipped with Strata."""
