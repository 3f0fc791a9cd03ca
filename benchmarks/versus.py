"""consumerkit against an earlier revision of itself, in alternating runs on one machine.

    python -m benchmarks.versus --base REV [--rounds 4] [--peers consumerkit,set-based]
                                [--yardstick set-based] [--events N] [--runs 1]
                                [--postgres DSN] [--kafka BOOTSTRAP] [--json out.json]

A peer of another revision cannot run in this process: ``REV`` is checked out into a
temporary git worktree, and each round runs the throughput benchmark of ``REV`` and of this
tree, each in a process of its own, in alternating order (base first in odd rounds). Each
revision runs its own benchmark code with its own defaults, so "consumerkit" means each
revision's defaults. Both run on the same footing: CPython's collector settings (a revision
whose benchmarks tune the collector is told not to) and uvloop when it is installed (a revision
whose benchmarks default to asyncio's loop is told to use it).

The verdict for each peer is the median over the rounds of this tree's msg/s over the base's
in the same round, beside the same ratio taken on each run's share of its own ``--yardstick``
peer (a hand-written peer, the same code in both trees: what moves between the two processes
of a round moves it too).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.versus",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--base", required=True, help="the git revision to compare against")
    p.add_argument("--rounds", type=int, default=4, help="default %(default)s")
    p.add_argument("--peers", default="consumerkit,set-based", help="default %(default)s")
    p.add_argument("--yardstick", default="set-based",
                   help="the peer each run's rates are also taken as shares of "
                        "(default %(default)s; one of --peers)")
    p.add_argument("--events", type=int, default=20_000, help="default %(default)s")
    p.add_argument("--runs", type=int, default=1, help="runs per process (default 1)")
    p.add_argument("--postgres", help="DSN (else each process's own default)")
    p.add_argument("--kafka", help="bootstrap (else each process's own default)")
    p.add_argument("--json", type=Path, help="also write the rounds and verdicts here")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.runs < 1 or args.events < 1:
        p.error("need --rounds, --runs and --events >= 1")
    if args.yardstick not in args.peers.split(","):
        p.error("--yardstick must be one of --peers")
    return args


def rates(document: dict[str, Any]) -> dict[str, float]:
    """Each exact peer's median msg/s in a throughput JSON document."""
    return {p["peer"]: p["median_msg_per_s"] for p in document["peers"]
            if p.get("median_msg_per_s")}


def verdicts(rounds: list[dict[str, dict[str, float]]], peers: Sequence[str],
             yardstick: str) -> dict[str, dict[str, Any]]:
    """Per peer, the median over ``rounds`` (each ``{"base": rates, "head": rates}``) of head's
    rate over base's, and of head's share of ``yardstick`` over base's."""
    found: dict[str, dict[str, Any]] = {}
    for peer in peers:
        ratios, multiples = [], []
        for r in rounds:
            base, head = r["base"], r["head"]
            if base.get(peer) and head.get(peer):
                ratios.append(head[peer] / base[peer])
                if peer != yardstick and base.get(yardstick) and head.get(yardstick):
                    multiples.append((head[peer] / head[yardstick])
                                     / (base[peer] / base[yardstick]))
        found[peer] = {
            "rounds": len(ratios),
            "ratio": statistics.median(ratios) if ratios else None,
            "per_round": [round(x, 3) for x in ratios],
            "share_ratio": statistics.median(multiples) if multiples else None,
        }
    return found


def _same_footing(tree: Path) -> list[str]:
    """The options that put ``tree``'s benchmark on the common footing: CPython's collector
    settings (``--no-gc-tuning`` where it tunes them) and uvloop when installed (``--uvloop``
    where it is not the default)."""
    helped = subprocess.run([sys.executable, "-m", "benchmarks.throughput", "--help"],
                            cwd=tree, capture_output=True, text=True, check=True).stdout
    return [flag for flag in ("--no-gc-tuning", "--uvloop") if f"{flag} " in helped
            or f"{flag}\n" in helped]


def _run(tree: Path, footing: list[str], args: argparse.Namespace, out: Path,
         ) -> dict[str, float]:
    command = [sys.executable, "-m", "benchmarks.throughput", "--peers", args.peers,
               "--events", str(args.events), "--runs", str(args.runs), "--json", str(out),
               *footing]
    for flag in ("postgres", "kafka"):
        if getattr(args, flag):
            command += [f"--{flag}", getattr(args, flag)]
    subprocess.run(command, cwd=tree, check=True, stdout=subprocess.DEVNULL)
    return rates(json.loads(out.read_text()))


def table(rounds: list[dict[str, Any]], found: dict[str, dict[str, Any]], base: str,
          yardstick: str) -> str:
    peers = list(found)
    lines = ["| round | first | " + " | ".join(f"{p} base / head msg/s" for p in peers) + " |",
             "|---|---|" + "---:|" * len(peers)]
    for i, r in enumerate(rounds, 1):
        cells = [f"{r['base'].get(p, 0):,.0f} / {r['head'].get(p, 0):,.0f}" for p in peers]
        lines.append(f"| {i} | {r['first']} | " + " | ".join(cells) + " |")
    lines.append("")
    for peer, v in found.items():
        if v["ratio"] is None:
            lines.append(f"- {peer}: not measured")
            continue
        multiple = v["share_ratio"]
        lines.append(
            f"- {peer}: this tree / {base} = **{v['ratio']:.3f}x** (median of {v['rounds']} "
            f"rounds: {', '.join(f'{x:.3f}' for x in v['per_round'])})"
            + (f"; as a share of {yardstick} {multiple:.3f}x" if multiple is not None
               else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    peers = args.peers.split(",")
    with tempfile.TemporaryDirectory(prefix="ck-versus-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base],
                       cwd=ROOT, check=True, capture_output=True)
        try:
            trees = {"base": base_tree, "head": ROOT}
            footings = {which: _same_footing(tree) for which, tree in trees.items()}
            rounds: list[dict[str, Any]] = []
            for i in range(args.rounds):
                order = ("base", "head") if i % 2 == 0 else ("head", "base")
                done: dict[str, Any] = {"first": order[0]}
                for which in order:
                    done[which] = _run(trees[which], footings[which], args,
                                       Path(tmp) / f"{which}-{i}.json")
                    print(f"round {i + 1} {which}: " + ", ".join(
                        f"{p} {done[which].get(p, 0):,.0f} msg/s" for p in peers), flush=True)
                rounds.append(done)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)],
                           cwd=ROOT, check=False, capture_output=True)
    found = verdicts(rounds, peers, args.yardstick)
    print(table(rounds, found, args.base, args.yardstick))
    if args.json:
        args.json.write_text(json.dumps(
            {"base": args.base, "events": args.events, "rounds": rounds, "verdicts": found},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
