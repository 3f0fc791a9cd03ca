#!/usr/bin/env bash
# Build a PgBouncer with protocol-level prepared statements (1.21 and later) for the tests
# that run through one with `max_prepared_statements` (tests/pooler): Debian 12 ships 1.18,
# which has none. The source is Debian 13's package (1.24.1 today), fetched with a sources list of
# its own so the machine's lists stay as they are; the binary is kept under
# ~/.cache/consumerkit, which outlives a clone, and printed on the last line. Needs apt-get,
# a C compiler, make, pkg-config, libssl-dev and libevent-dev (installed here when missing
# and allowed). About a minute of one core the first time; nothing after.
#
#   bin=$(bash scripts/pgbouncer-newer.sh) && export CONSUMERKIT_TEST_PGBOUNCER=$bin
set -euo pipefail
cache=${XDG_CACHE_HOME:-$HOME/.cache}/consumerkit/pgbouncer-trixie
binary=$cache/pgbouncer
if [ -x "$binary" ]; then
    echo "$binary"
    exit 0
fi
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo -n"
missing=()
for header in event2/event.h openssl/ssl.h; do
    [ -e "/usr/include/$header" ] || missing+=("$([ "$header" = event2/event.h ] && echo libevent-dev || echo libssl-dev)")
done
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v make >/dev/null || missing+=(make)
command -v cc >/dev/null || missing+=(gcc)
if [ ${#missing[@]} -gt 0 ]; then
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >&2
fi
work=$(mktemp -d /tmp/pgbouncer-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "deb-src http://deb.debian.org/debian trixie main" >"$work/sources.list"
mkdir -p "$work/lists/partial"
apt_opts=(-o "Dir::Etc::sourcelist=$work/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$work/lists" -o "APT::Sandbox::User=$(id -un)")
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$work" && apt-get "${apt_opts[@]}" -qq source --download-only pgbouncer >&2)
mkdir "$work/src"
tar -C "$work/src" --strip-components=1 -xzf "$(ls "$work"/pgbouncer_*.orig.tar.gz)"
(cd "$work/src" && ./configure -q >&2 && make -s >&2)
mkdir -p "$cache"
cp "$work/src/pgbouncer" "$binary.tmp"
mv "$binary.tmp" "$binary"
"$binary" --version | head -1 >&2
echo "$binary"
