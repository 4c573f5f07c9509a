"""``python -m lab.soak [options]`` (``make soak``)."""

import sys

from lab.soak.command import main

sys.exit(main())
