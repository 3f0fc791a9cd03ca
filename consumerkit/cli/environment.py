"""The ``.env`` file of the current folder, read by every command.

The commands with ``--env-file`` (``run``, ``relay``, ``config``, ``check``, ``dev``) read it
themselves; the others (``migrate``, ``topics``, ``dead-letters``, ``send``, ...) read
``CONSUMERKIT_*`` variables. So that all of them agree, the ``CONSUMERKIT_*`` entries of
``./.env`` become variables before a command runs, below any variable already set: a flag
beats a variable, which beats ``.env``, as docs/configuration.md says.
"""

from __future__ import annotations

import os
from pathlib import Path

from dotenv import dotenv_values

from ..settings import PREFIX


def load_dotenv_defaults(path: Path = Path(".env")) -> list[str]:
    """Set each ``CONSUMERKIT_*`` entry of ``path`` that no variable sets; the names set."""
    if not path.is_file():
        return []
    try:
        values = dotenv_values(path)
    except (OSError, UnicodeDecodeError):
        return []  # the commands that read it themselves report it
    added = []
    for name, value in values.items():
        if name.upper().startswith(PREFIX) and value is not None and name not in os.environ:
            os.environ[name] = value
            added.append(name)
    return added
