"""Start a Kafka-protocol broker, PostgreSQL and Redis locally, without Docker, for a session of
experiments (needs ``pip install 'consumerkit[embedded]'``).

It prints the variables to export: ``CONSUMERKIT_*`` are the ones the command line and the
examples read (named after the ``Consumer`` arguments), ``CONSUMERKIT_TEST_*`` the ones the test
suite reads instead of starting servers of its own.
"""

from __future__ import annotations

from consumerkit.testing.services import start_postgres, start_redis, start_tansu


def exports(kafka: str, postgres: str, redis: str) -> list[str]:
    values = {"KAFKA_BOOTSTRAP": kafka, "POSTGRES_DSN": postgres, "REDIS_URL": redis}
    return [f"export {prefix}{name}='{value}'"
            for prefix in ("CONSUMERKIT_", "CONSUMERKIT_TEST_")
            for name, value in values.items()]


def main() -> None:
    with start_tansu() as broker, start_postgres() as postgres, start_redis() as redis:
        print("\n".join(exports(broker.bootstrap, postgres.dsn, redis.url)))
        input("services are running; press Enter to stop them\n")


if __name__ == "__main__":
    main()
