"""``python -m asyncrl.cli``: the ``asyncrl`` command."""

import sys

from asyncrl.cli import main

sys.exit(main())
