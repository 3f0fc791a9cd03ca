#!/usr/bin/env bash
# The suites through a real PgBouncer in transaction mode (issue 35's acceptance): one PgBouncer
# (tests/harness/pgbouncer.py: pool_mode=transaction, as PgBouncer 1.18 behaves) in front of
# the PostgreSQL given, every consumer and relay of the tests built with
# postgres_pooler="transaction" (tests/pooling.py).
#
#   scripts/test-pooler.sh                       embedded PostgreSQL behind the PgBouncer
#   scripts/test-pooler.sh postgresql://...      that server instead (CI: pass 2's PostgreSQL 15)
#   scripts/test-pooler.sh DSN -k relay -x       extra arguments go to pytest
#   POOLER_TESTS="tests/pooler" scripts/test-pooler.sh   other tests than SUITE
#
# The tests get CONSUMERKIT_TEST_POSTGRES_DSN=PgBouncer, CONSUMERKIT_TEST_DIRECT_POSTGRES_DSN=the
# server (for what a test does on a session of its own) and
# CONSUMERKIT_TEST_POSTGRES_POOLER=transaction. What runs (SUITE below) fits CI's 5 minutes:
# 92 tests, 5 skipped (2 about a direct connection, 3 that need PgBouncer 1.21+, which CI's pass
# 2 runs), took 191 to 238 s against PostgreSQL 15 on the 2-core machine while others worked
# on it. Left out, besides what is named below: the rest of
# tests/integration (batches, caches, stalls, offsets: the same consumer through the same
# pool, too long together for the 5 minutes), and the PostgreSQL-only suites (pass 2 runs them
# on the same server, directly).
SUITE=(
    # the outbox: writer, relay (two relays publishing every event exactly once in order,
    # slots rebalanced), failures, retention, readiness; not test_torture*.py (minutes, and
    # scripts/torture.sh already runs its short profile through PgBouncer), test_cdc_slot.py
    # (logical replication, a direct connection by nature) nor test_benchmark.py
    tests/outbox/test_writer.py tests/outbox/test_relay.py tests/outbox/test_relay_lifecycle.py
    tests/outbox/test_failures.py tests/outbox/test_outbox_details.py
    tests/outbox/test_retention.py tests/outbox/test_relay_readiness.py
    tests/outbox/test_retry_after.py tests/outbox/test_broker_restart.py
    tests/outbox/test_idempotence_refused.py
    # broker-facing consumers applying every event once: copies, rebalances, a kill, failures
    tests/integration/test_exactly_once.py tests/integration/test_failures.py
    tests/integration/test_saga.py
    # the pooler's own tests (leases, parked keys, dead letters, the CLI through PgBouncer)
    tests/pooler
    # migrate and check through it
    tests/cli/test_migrate_check.py
)
set -euo pipefail
cd "$(dirname "$0")/.."

[ -x .venv/bin/python ] || . scripts/venv.sh dev

server=()
if [ $# -gt 0 ] && [[ "$1" == postgres* ]]; then
    server=("$1"); shift
fi
work=$(mktemp -d /tmp/consumerkit-pooler.XXXXXX)
.venv/bin/python -m tests.harness.pgbouncer "${server[@]}" >"$work/dsns" 2>"$work/stderr" &
bouncer_pid=$!
trap 'kill "$bouncer_pid" 2>/dev/null; wait "$bouncer_pid" 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 1200); do  # up to 60 s: an embedded PostgreSQL starts first
    [ "$(wc -l <"$work/dsns")" -ge 2 ] && break
    kill -0 "$bouncer_pid" 2>/dev/null || { cat "$work/stderr" >&2; exit 1; }
    sleep 0.05
done
[ "$(wc -l <"$work/dsns")" -ge 2 ] || { echo "PgBouncer did not start in 60 s" >&2; exit 1; }
direct=$(sed -n 1p "$work/dsns")
bouncer=$(sed -n 2p "$work/dsns")
echo "== pytest through PgBouncer (transaction mode) at $bouncer"

export CONSUMERKIT_TEST_POSTGRES_DSN=$bouncer CONSUMERKIT_TEST_DIRECT_POSTGRES_DSN=$direct
export CONSUMERKIT_TEST_POSTGRES_POOLER=transaction
status=0
if [ -n "${POOLER_TESTS:-}" ]; then read -ra SUITE <<<"$POOLER_TESTS"; fi
.venv/bin/pytest -rs "${SUITE[@]}" "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
exit "$status"
