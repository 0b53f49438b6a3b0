"""``python -m convert.cli``: the ``imgpack`` command, as the tests run it."""

import sys

from convert.cli import main

sys.exit(main())
