#!/usr/bin/env bash
# The broker-facing suite against Apache Kafka: a three-node KRaft cluster (replication factor
# 3, min.insync.replicas=2, unclean leader election off) started for the session from Maven
# Central's jars, with the producers' idempotence on. Needs Java 17+ and Maven (docs/kafka.md).
#
#   scripts/test-kafka.sh                  the suite below
#   scripts/test-kafka.sh -k relay -x      extra arguments go to pytest
#
# CONSUMERKIT_TEST_KAFKA_VERSION picks the release (default: consumerkit.testing's), and
# CONSUMERKIT_TEST_KAFKA_BROKERS=1 a single node. The suite is every directory whose tests talk
# to the broker, plus tests/kafka (leaders killed, broker restarts, aborted transactions); left
# out: the unit, PostgreSQL-only, docs and webhook tests, the benchmarks (tests/test_benchmarks.py)
# and tests/torture, which do not depend on the broker or run it their own way.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/venv.sh dev

version=${CONSUMERKIT_TEST_KAFKA_VERSION:-}
echo "== Kafka jars (Maven Central, cached in \${CONSUMERKIT_KAFKA_CACHE:-~/.cache/consumerkit})"
if ! .venv/bin/python - "$version" <<'EOF'
import sys
from consumerkit.errors import ConsumerKitError
from tests.harness.kafka_jars import DEFAULT_KAFKA_VERSION, kafka_lib
version = sys.argv[1] or DEFAULT_KAFKA_VERSION
try:
    print(f"Apache Kafka {version}: {kafka_lib(version)}")
except ConsumerKitError as exc:
    print(f"cannot get Apache Kafka {version}'s jars: {exc}", file=sys.stderr)
    sys.exit(1)
EOF
then
    exit 1
fi

echo "== pytest on Apache Kafka"
export CONSUMERKIT_TEST_BROKER=kafka
unset CONSUMERKIT_TEST_KAFKA_BOOTSTRAP
status=0
.venv/bin/pytest tests/kafka tests/integration tests/outbox tests/contract tests/cli \
    tests/parking tests/observability tests/operations tests/test_services.py "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
fi
exit "$status"
