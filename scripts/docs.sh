#!/usr/bin/env bash
# Build the docs site into site/; any warning fails the build (a page left out of the nav, a
# link to a missing page, file or anchor). Never pass --quiet: it hides the warnings from
# --strict, and the build then passes with them.
#
#   scripts/docs.sh            the checkout this script is in
#   scripts/docs.sh DIR        a copy of it (the test that proves a warning fails the build)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
NO_MKDOCS_2_WARNING=1 "${PYTHON:-.venv/bin/python}" -m mkdocs build --strict
