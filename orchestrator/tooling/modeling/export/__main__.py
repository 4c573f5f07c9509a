"""``python -m orchestrator.tooling.modeling.export``: the ``orchestrator export`` command."""

import sys

from orchestrator.tooling.modeling.export.cli import main

sys.exit(main())
