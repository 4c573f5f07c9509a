"""``python -m orchestrator.tooling.soak [options]`` (same as ``orchestrator soak``)."""

import sys

from orchestrator.tooling.soak.command import main

sys.exit(main())
