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
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
out=${1:-$(mktemp -d)}
mkdir -p "$out"

echo "== torture: short profile"
$python -m tests.torture --profile short --seed 1 --report "$out/short.json" \
    --markdown "$out/short.md"

echo "== torture: short profile through PgBouncer in transaction mode"
# every consumer, relay and producer through a real PgBouncer (postgres_pooler="transaction"),
# with PgBouncer's own faults; without a pgbouncer binary the step skips, saying why
if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
    $python -m tests.torture --profile short --seed 1 --pooler transaction \
        --report "$out/short-pooler.json" --markdown "$out/short-pooler.md"
else
    echo "torture: pooler pass skipped: pgbouncer is not installed (apt-get install pgbouncer)"
fi

echo "== torture: the failover fault's negative control (offsets in Kafka must lose effects)"
status=0
$python -m tests.torture --profile failover-kafka --seed 1 --report "$out/failover-kafka.json" \
    --markdown "$out/failover-kafka.md" || status=$?
lost=$($python -c "import json, sys; r = json.load(open(sys.argv[1])); \
print(r['lost'] if r['failovers'] else 0)" "$out/failover-kafka.json" 2>/dev/null || echo 0)
if [ "$status" != 1 ] || [ "$lost" -lt 1 ]; then
    echo "torture: a failover with offsets in Kafka lost nothing (exit $status, lost $lost):" \
        "the fault did not reach what it should" >&2
    exit 1
fi
echo "torture: failover with offsets in Kafka lost $lost effects, as it must"

for mutant in $($python -c "from consumerkit.shared.faults import MUTANTS; print(*MUTANTS)"); do
    caught=""
    for seed in 1 2; do
        status=0
        $python -m tests.torture --profile mutant --seed "$seed" --mutant "$mutant" \
            --report "$out/mutant-$mutant.json" || status=$?
        case "$status" in
            1) caught=$seed; break ;;
            0) echo "torture: mutant $mutant passed with seed $seed" ;;
            *) echo "torture: the run of mutant $mutant broke (exit $status)" >&2; exit 1 ;;
        esac
    done
    if [ -z "$caught" ]; then
        echo "torture: mutant $mutant was NOT caught: the checker cannot see its bug" >&2
        exit 1
    fi
    echo "torture: mutant $mutant caught (seed $caught)"
done
echo "== torture: kafka profile (three Apache Kafka brokers, broker faults, transactions)"
# Java 17+ (and Maven, the first time, for the jars); without them the profile skips, saying why
if skip=$($python -c "
from consumerkit.errors import ConsumerKitError
from tests.harness.kafka_jars import kafka_lib, require_tools
try:
    require_tools(maven=False)
    kafka_lib()
except ConsumerKitError as exc:
    print(exc)
"); [ -n "$skip" ]; then
    echo "torture: kafka profile skipped: $skip"
else
    $python -m tests.torture --profile kafka --seed 1 --report "$out/kafka.json" \
        --markdown "$out/kafka.md"
    status=0
    $python -m tests.torture --profile kafka-mutant --seed 1 --mutant read_uncommitted \
        --report "$out/kafka-mutant.json" || status=$?
    if [ "$status" != 1 ]; then
        echo "torture: consumers reading uncommitted records were NOT caught applying aborted" \
            "transactions (exit $status)" >&2
        exit 1
    fi
    echo "torture: mutant read_uncommitted caught"
fi
echo "== torture: reports in $out"
