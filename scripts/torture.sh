#!/usr/bin/env bash
# The torture test as CI runs it: the short profile must pass (no duplicate, lost, phantom or
# out-of-order effect), directly and through PgBouncer in transaction mode, then every
# deliberately broken variant must be caught at a small size.
# A variant that passes once is tried with a second seed (the faults that expose it land at
# random moments); passing both is an uncaught mutant, and fails. Where Java 17+ is installed,
# the kafka profile (broker failures on three Apache Kafka nodes, transactional producers) must
# pass too, and its negative control (consumers reading uncommitted records) must be caught.
#
#   scripts/torture.sh [REPORT_DIR]      reports (JSON and Markdown) go to REPORT_DIR
#
# Each run starts services of its own (PostgreSQL and its standby in a temporary directory,
# Tansu or three Kafka nodes, Redis, PgBouncer, all on free ports) and is paced by its producers
# (events per second), not by the CPU: so the steps run CONSUMERKIT_TORTURE_JOBS at a time
# (3 by default; 1 runs them one after the other). Each step's output goes to
# REPORT_DIR/STEP.log, printed when the step ends, in the order below.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${1:-$(mktemp -d)}
mkdir -p "$out"
jobs=${CONSUMERKIT_TORTURE_JOBS:-3}

short() {
    $python -m tests.torture --profile short --seed 1 --report "$out/short.json" \
        --markdown "$out/short.md"
}

short_pooler() {
    # every consumer, relay and producer through a real PgBouncer (postgres_pooler=
    # "transaction"), with PgBouncer's own faults; without a pgbouncer binary it skips, saying why
    if ! { command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; }; then
        echo "torture: pooler pass skipped: pgbouncer is not installed (apt-get install pgbouncer)"
        return 0
    fi
    $python -m tests.torture --profile short --seed 1 --pooler transaction \
        --report "$out/short-pooler.json" --markdown "$out/short-pooler.md"
}

failover_control() {
    local status=0 lost
    $python -m tests.torture --profile failover-kafka --seed 1 \
        --report "$out/failover-kafka.json" --markdown "$out/failover-kafka.md" || status=$?
    lost=$($python -c "import json, sys; r = json.load(open(sys.argv[1])); \
print(r['lost'] if r['failovers'] else 0)" "$out/failover-kafka.json" 2>/dev/null || echo 0)
    if [ "$status" != 1 ] || [ "$lost" -lt 1 ]; then
        echo "torture: a failover with offsets in Kafka lost nothing (exit $status, lost $lost):" \
            "the fault did not reach what it should" >&2
        return 1
    fi
    echo "torture: failover with offsets in Kafka lost $lost effects, as it must"
}

mutant() {
    local mutant=$1 seed status
    for seed in 1 2; do
        status=0
        $python -m tests.torture --profile mutant --seed "$seed" --mutant "$mutant" \
            --report "$out/mutant-$mutant.json" || status=$?
        case "$status" in
            1) echo "torture: mutant $mutant caught (seed $seed)"; return 0 ;;
            0) echo "torture: mutant $mutant passed with seed $seed" ;;
            *) echo "torture: the run of mutant $mutant broke (exit $status)" >&2; return 1 ;;
        esac
    done
    echo "torture: mutant $mutant was NOT caught: the checker cannot see its bug" >&2
    return 1
}

kafka() {
    # Java 17+ (and Maven, the first time, for the jars); without them the profile skips
    local skip status=0
    skip=$($python -c "
from consumerkit.errors import ConsumerKitError
from tests.harness.kafka_jars import kafka_lib, require_tools
try:
    require_tools(maven=False)
    kafka_lib()
except ConsumerKitError as exc:
    print(exc)
")
    if [ -n "$skip" ]; then
        echo "torture: kafka profile skipped: $skip"
        return 0
    fi
    $python -m tests.torture --profile kafka --seed 1 --report "$out/kafka.json" \
        --markdown "$out/kafka.md" || return 1
    $python -m tests.torture --profile kafka-mutant --seed 1 --mutant read_uncommitted \
        --report "$out/kafka-mutant.json" || status=$?
    if [ "$status" != 1 ]; then
        echo "torture: consumers reading uncommitted records were NOT caught applying aborted" \
            "transactions (exit $status)" >&2
        return 1
    fi
    echo "torture: mutant read_uncommitted caught"
}

# name, then the function and its arguments; the kafka steps (three JVMs each) come first so
# that the longest step does not start last
steps=(
    "kafka|kafka|kafka profile (three Apache Kafka brokers, broker faults, transactions)"
    "short|short|short profile"
    "short-pooler|short_pooler|short profile through PgBouncer in transaction mode"
    "failover-kafka|failover_control|the failover fault's negative control (offsets in Kafka must lose effects)"
)
for name in $($python -c "from consumerkit.shared.faults import MUTANTS; print(*MUTANTS)"); do
    steps+=("mutant-$name|mutant $name|mutant $name must be caught")
done

declare -A pid_of
started() { jobs -rp | wc -l; }
for step in "${steps[@]}"; do
    IFS='|' read -r name call _ <<<"$step"
    while [ "$(started)" -ge "$jobs" ]; do wait -n || true; done
    # shellcheck disable=SC2086  # $call is a function name and its arguments
    ( set +e; $call; echo "$?" >"$out/$name.status" ) >"$out/$name.log" 2>&1 &
    pid_of[$name]=$!
done

failed=()
for step in "${steps[@]}"; do
    IFS='|' read -r name _ title <<<"$step"
    wait "${pid_of[$name]}" || true
    echo "== torture: $title"
    cat "$out/$name.log"
    [ "$(cat "$out/$name.status" 2>/dev/null || echo 2)" = 0 ] || failed+=("$name")
done
echo "== torture: reports in $out"
if [ ${#failed[@]} -gt 0 ]; then
    echo "torture: failed: ${failed[*]}" >&2
    exit 1
fi
