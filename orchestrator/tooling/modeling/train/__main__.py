"""``python -m orchestrator.tooling.modeling.train`` (``make model``)."""

import sys

from orchestrator.tooling.modeling.train.run import main

sys.exit(main())
