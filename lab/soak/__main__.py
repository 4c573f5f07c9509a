"""``python -m lab.soak [options]`` (same as ``orchestrator soak``)."""

import sys

from lab.soak.command import main

sys.exit(main())
