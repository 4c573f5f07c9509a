"""``python -m orchestrator.tooling.modeling.parity``: the ``orchestrator parity`` command."""

import sys

from orchestrator.tooling.modeling.parity.run import main

sys.exit(main())
