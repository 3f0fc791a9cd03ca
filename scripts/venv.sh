# Sourced by the scripts: make sure .venv exists (Python 3.11 or newer), then install
# consumerkit into it with the extras given as "$1" (e.g. dev, embedded).
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
        echo "consumerkit needs Python 3.11 or newer; set PYTHON=/path/to/python3.11" >&2
        exit 1
    }
    echo "== creating .venv"
    "$python" -m venv .venv
fi
echo "== installing consumerkit[$1] into .venv"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$1]"
