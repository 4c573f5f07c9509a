"""``python -m orchestrator.tooling.env env ...|stub ...``: see :mod:`orchestrator.tooling.env.commands`."""

import sys

from orchestrator.tooling.env.commands import main

sys.exit(main())
