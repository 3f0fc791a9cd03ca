"""Copy a run's Markdown summary into ``docs/benchmarks.md``, under a fixed introduction, in
its broker's section: a run on Tansu replaces the Tansu run, a run on Apache Kafka the Kafka
run, and the other broker's run stays as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .markdown import render

PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
COMPARED = Path(__file__).resolve().parent / "compared.md"
"""The peers compared from their code (omni-box cannot run here), after every run's figures."""
CDC = Path(__file__).resolve().parent / "cdc.md"
"""The relay against Debezium, written by ``python -m benchmarks.cdc --docs`` (it needs Java)."""
CLAIM_WAIT = Path(__file__).resolve().parent / "claim_wait.md"
"""The claim's wait, guard against advisory locks (``python -m benchmarks.claim_wait``)."""
LOCK_SCALING = Path(__file__).resolve().parent / "lock_scaling.md"
"""The lock table and CPU per message from 1 to 12 processes (``python -m
benchmarks.lock_scaling``)."""

INTRO = """\
# Benchmarks

consumerkit measured against the other ways of consuming the same topic, in one run, on the
same PostgreSQL and broker: a raw consumer (the ceiling), the textbook per-message
transaction, a tuned and a set-based hand-written loop, FastStream with a hand-written dedup,
and consumerkit with its defaults, with the Redis cache, with its best settings, with
`ctx.defer` and with a batch handler, and its defaults of the day before batch handlers and
`ctx.defer` (an earlier revision, in a process of its own); the set-based loop again on a
table partitioned by the day ids were seen, on one partitioned by the event's own day (a
unique key, a weaker guarantee) and on consumerkit's dedup table, which tell the dedup
table's cost from the engine's; and consumerkit's outbox relay against faststream-outbox's.
omni-box, which needs Python 3.12, is compared from its code at the end. Every peer gets its
own consumer group and a fresh schema; every run checks that each distinct event had exactly
one effect, and a peer that lost or duplicated one is marked WRONG and not ranked.

This page is written by the suite itself:

```bash
.venv/bin/pip install -e '.[bench]'
.venv/bin/python -m benchmarks --profile quick --docs     # under 3 minutes
.venv/bin/python -m benchmarks --profile full --out results/
```

How the suite works, every peer and every column:
[`benchmarks/README.md`](../benchmarks/README.md).

**Read the ratios, not the absolute numbers.** The figures below come from {machine},
with PostgreSQL at `fsync=on` and `synchronous_commit=on`; the first run on an embedded Tansu
broker (memory storage), the second on three Apache Kafka brokers; all on the same cores,
which other work shares. Absolute msg/s move by tens
of percent between runs on such a machine; the ratios between peers measured in the same run
(columns "of raw" and "x textbook") are what to compare. Commits and WAL syncs per message are
read from server-wide counters, so concurrent use of the same PostgreSQL inflates them.

The quick profile is small (2,000 messages in its main cell), so there the fastest peers
finish in a fraction of a second and the raw ceiling is coarse; the full profile runs 20,000.
In the cleanup cell both sides grow with the rows a day holds: the `DELETE` by about 3 µs a
row, the drop by the time the file system takes to free the partition's files when its
`DROP TABLE` commits (about 0.25 s for the 700 MB of 5,000,000 rows on this machine's disk,
where truncating a 700 MB file alone takes 0.16 s). The drop holds the dedup table's lock
only to detach the partition, before that.

An outbox kept for change data capture in day partitions (`python -m
benchmarks.outbox_retention --rows 100000`, one run, not part of the suite) shows the same
trade on another table: the expired day's 100,000 rows dropped with their partition in
0.029 s and 202 KiB of WAL, against 0.240 s and 31.3 MiB for `cleanup`'s batched `DELETE` of
the same rows, plus 0.036 s and 2.0 MiB for the `VACUUM` after it. A writer adding events to
the same outbox saw its commit p50 go from 1.6 to 2.9 ms during the `DELETE`, and no change
during the drop.

"""


BEGIN = {"tansu": "<!-- run on Tansu: python -m benchmarks --docs -->",
         "kafka": "<!-- run on Apache Kafka: python -m benchmarks --broker kafka --docs -->"}
END = "<!-- end of run -->"
KAFKA = """\
## On Apache Kafka: three brokers

The main and relay cells again, every peer on a three-broker Apache Kafka cluster (KRaft,
replication factor 3, `min.insync.replicas=2`, unclean leader election off; every producer
idempotent with `acks=all`), all of them in one run, written here by:

```bash
.venv/bin/python -m benchmarks --broker kafka --profile full --cells main,relay --docs
```

"""
NOT_YET = "Not measured yet: the command above writes this broker's run here."


def _run_of(page: str, kind: str) -> str:
    """The run kept on ``page`` for broker ``kind``, else a line saying how to measure it."""
    begin = BEGIN[kind]
    if begin in page and END in page.split(begin, 1)[1]:
        return page.split(begin, 1)[1].split(END, 1)[0].strip("\n")
    return NOT_YET


def write(document: dict[str, Any], page: Path = PAGE) -> Path:
    context = document["context"]
    machine = f"one machine (CPUs: {context.get('cpus', 'unknown')})"
    before = page.read_text() if page.exists() else ""
    runs = {kind: _run_of(before, kind) for kind in BEGIN}
    runs[document.get("broker", "tansu")] = render(document).strip("\n")
    page.write_text(INTRO.format(machine=machine)
                    + f"{BEGIN['tansu']}\n{runs['tansu']}\n{END}\n\n"
                    + KAFKA + f"{BEGIN['kafka']}\n{runs['kafka']}\n{END}\n\n"
                    + (CLAIM_WAIT.read_text() + "\n" if CLAIM_WAIT.exists() else "")
                    + (LOCK_SCALING.read_text() + "\n" if LOCK_SCALING.exists() else "")
                    + COMPARED.read_text()
                    + ("\n" + CDC.read_text() if CDC.exists() else ""))
    return page
