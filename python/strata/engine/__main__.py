"""`python -m strata.engine --fd N`: the engine process (see strata.engine.core)."""

import sys

from strata.engine.core import main

sys.exit(main())
