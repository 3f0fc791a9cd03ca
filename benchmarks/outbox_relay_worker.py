"""One outbox relay in its own OS process, for the relay benchmark:
``python -m benchmarks.outbox_relay_worker --dsn DSN --bootstrap HOST:PORT --schema S --topic T``
(``--idempotence`` on a broker that has the idempotent producer; Tansu has none;
``--pooler`` and ``--poll`` for a relay behind a connection pooler).

Runs until SIGTERM or SIGINT, then stops after the batch in flight.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from consumerkit import Postgres
from consumerkit.outbox import KafkaSink, Relay
from consumerkit.shared import aio
from consumerkit.shared.pooler import POOLERS


async def relay(args: argparse.Namespace) -> None:
    sink = KafkaSink(args.bootstrap, route=args.topic,
                     kafka_options={"enable_idempotence": args.idempotence})
    await Relay(Postgres(dsn=args.dsn, schema=args.schema, pooler=args.pooler), sink,
                name=args.name, batch_size=args.batch,
                rebalance_interval=0.2, poll_interval=args.poll).run()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.outbox_relay_worker")
    for name in ("--dsn", "--bootstrap", "--schema", "--topic", "--name"):
        p.add_argument(name, required=True)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--idempotence", action="store_true")
    p.add_argument("--pooler", choices=POOLERS, default="none")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = p.parse_args(argv)
    aio.run(relay(args), use_uvloop=args.uvloop)


if __name__ == "__main__":
    main()
