#!/usr/bin/env bash
# Install consumerkit with its development extras into .venv, then lint, check the layers
# (import-linter), type-check, build the docs site (warnings are errors) and test.
#
#   scripts/test.sh                 everything
#   scripts/test.sh -k kafka -x     extra arguments go to pytest
#   scripts/test.sh -n 0            one process (CONSUMERKIT_TEST_WORKERS=0 does the same)
#
# pytest runs on CONSUMERKIT_TEST_WORKERS pytest-xdist workers (4 by default: a serial run keeps
# about two thirds of one core busy, the tests mostly wait on servers, sockets and subprocesses,
# so 4 workers still fit 2 cores), each with embedded services of its own; the tests that start
# Apache Kafka's JVMs go to two of them, by group (tests/conftest.py).
#
# Services come from CONSUMERKIT_TEST_POSTGRES_DSN, CONSUMERKIT_TEST_KAFKA_BOOTSTRAP and
# CONSUMERKIT_TEST_REDIS_URL when set; otherwise the tests start local ones (no Docker needed).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh dev

echo "== ruff"
.venv/bin/ruff check .

echo "== lint-imports (the layers in pyproject.toml)"
.venv/bin/lint-imports

echo "== mypy"
.venv/bin/mypy

echo "== mkdocs build --strict"
bash scripts/docs.sh

echo "== pytest"
status=0
.venv/bin/pytest -n "${CONSUMERKIT_TEST_WORKERS:-4}" --dist loadgroup "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
exit "$status"
