"""``python -m lab.bench`` (``make bench``): the benchmark's command line."""

import sys

from lab.bench.cli import main

sys.exit(main())
