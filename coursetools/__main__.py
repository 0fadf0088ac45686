"""``python -m coursetools``: the toolkit's command line (:mod:`coursetools.cli`)."""

import sys

from coursetools.cli import main

sys.exit(main())
