"""``python -m orchestrator.tooling.bench`` (``make bench``): the ``orchestrator bench`` command."""

import sys

from orchestrator.tooling.bench.cli import main

sys.exit(main())
