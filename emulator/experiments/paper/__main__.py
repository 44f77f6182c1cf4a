"""``python -m emulator.experiments.paper``: see :mod:`emulator.experiments.paper.driver`."""

import sys

from emulator.experiments.paper.driver import main

sys.exit(main())
