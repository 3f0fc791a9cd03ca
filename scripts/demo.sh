#!/usr/bin/env bash
# Run the consumerkit demo on embedded services (Tansu broker + PostgreSQL from PyPI wheels):
# order events with duplicates go through a billing consumer; it prints deliveries vs effects.
#
#   scripts/demo.sh                  500 orders
#   scripts/demo.sh --orders 2000    extra arguments go to `consumerkit demo`
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "consumerkit needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
        exit 1
    }
    "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[embedded]'
exec .venv/bin/consumerkit demo "$@"
