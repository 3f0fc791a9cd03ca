"""``python -m consumerkit`` is the ``consumerkit`` command."""

import sys

from .cli import main

sys.exit(main())
