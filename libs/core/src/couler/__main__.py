"""``python -m couler`` runs the command line."""

import sys

from couler.cli import main

sys.exit(main())
