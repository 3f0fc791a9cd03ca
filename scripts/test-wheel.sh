#!/usr/bin/env bash
# consumerkit installed as a user installs it: build the wheel and the sdist, install the wheel
# into a fresh virtual environment outside the checkout, then run the example service's own
# tests and docs/first-hour.md's commands (on `consumerkit dev`) with that environment's
# consumerkit only. Needs .venv (scripts/test.sh makes it) for the build.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
python="${PYTHON:-python3}"
work=$(mktemp -d /tmp/consumerkit-wheel.XXXXXX)
trap 'rm -rf "$work"' EXIT

echo "== building the wheel and the sdist"
.venv/bin/python -m hatchling build -t wheel -t sdist -d "$work/dist" >/dev/null 2>&1
wheel=$(ls "$work"/dist/consumerkit-*.whl)
ls "$work"/dist/consumerkit-*.tar.gz >/dev/null
echo "   $(basename "$wheel"), $(basename "$(ls "$work"/dist/consumerkit-*.tar.gz)")"

echo "== installing it into a fresh virtual environment in $work"
"$python" -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check "${wheel}[embedded]" \
    pytest pytest-asyncio
cp -r examples/service "$work/service"
(cd "$work" && "$work/venv/bin/python" -c '
import sys, consumerkit
assert consumerkit.__file__.startswith(sys.prefix), consumerkit.__file__  # not the checkout
print(f"   consumerkit {consumerkit.__version__} from {consumerkit.__file__}")')

echo "== the example service's tests, with the installed package and its pytest plugin"
(cd "$work/service" && "$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-deps . \
    && "$work/venv/bin/python" -m pytest -q -p no:cacheprovider tests)

echo "== docs/first-hour.md, typed with the installed consumerkit first on PATH"
(cd "$work" && env -u PYTHONPATH PATH="$work/venv/bin:$PATH" \
    "$work/venv/bin/python" "$root/tests/docs/first_hour.py" "$root/docs/first-hour.md" \
    "$work/first-hour")
