"""``python -m lab.train`` (``make model``)."""

import sys

from lab.train.run import main

sys.exit(main())
