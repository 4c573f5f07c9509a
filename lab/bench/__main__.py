"""``python -m lab.bench`` (``make bench``): the ``orchestrator bench`` command."""

import sys

from lab.bench.cli import main

sys.exit(main())
