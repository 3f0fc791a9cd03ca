#!/usr/bin/env bash
# Run the consumerkit demo on embedded services (Tansu broker + PostgreSQL from PyPI wheels):
# order events with duplicates go through a billing consumer; it prints deliveries vs effects.
#
#   scripts/demo.sh                  500 orders
#   scripts/demo.sh --orders 2000    extra arguments go to `consumerkit demo`
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh embedded
exec .venv/bin/consumerkit demo "$@"
