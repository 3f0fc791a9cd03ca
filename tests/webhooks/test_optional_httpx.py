"""httpx is optional: consumerkit, its receiver included, imports without it, and asking for
the sink says which extra to install."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
sys.modules["httpx"] = None  # as if it were not installed
import consumerkit
from consumerkit import WebhookReceiver
try:
    from consumerkit import WebhookSink
except ImportError as exc:
    print(exc)
"""


def test_consumerkit_imports_without_httpx_and_the_sink_names_the_extra() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "pip install 'consumerkit[webhook]'" in done.stdout
