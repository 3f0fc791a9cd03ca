"""Which commit went past a lost record, and what its consumer saw of that partition.

    python -m tests.torture.trace WORKDIR [TOPIC/PARTITION:OFFSET ...] [--late-starts]

``WORKDIR`` holds the process logs of a run kept with ``--keep-logs``; the positions are those
of lost events (the report's ``lost_positions``). The consumers log, at DEBUG on
``consumerkit.consumer.offsets``, where each ownership of a partition starts, offsets a fetch
jumped over, fetches dropped and every commit, sent and answered. For each position this
prints the first commit past it, by any consumer, and that consumer's story of the partition
up to that commit.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ([\w.]+): (.*)$")
_COMMIT = re.compile(r"([^\s/]+)/(\d+):(\d+)")


@dataclass(frozen=True, slots=True)
class Line:
    at: str  # sortable: the logs' asctime
    process: str
    logger: str
    text: str


def read_logs(workdir: Path) -> list[Line]:
    """Every consumer log line of ``workdir``, in time order."""
    lines: list[Line] = []
    for path in sorted(workdir.glob("consumer-*.log")):
        for raw in path.read_text(errors="replace").splitlines():
            if (m := _LINE.match(raw)) is not None:
                lines.append(Line(m[1], path.stem, m[3], m[4]))
    lines.sort(key=lambda line: line.at)
    return lines


def commits(line: Line) -> dict[tuple[str, int], int]:
    """The offsets a ``committing ...`` or ``committed ...`` line names, else nothing (a
    commit sent by a process killed before the answer may have landed)."""
    if line.logger != "consumerkit.consumer.offsets" or not line.text.startswith(
            ("committed ", "committing ")):
        return {}
    return {(m[1], int(m[2])): int(m[3]) for m in _COMMIT.finditer(line.text)}


def about(line: Line, topic: str, partition: int) -> bool:
    """Whether ``line`` speaks of the partition (its ownership, fetches, commits)."""
    if (topic, partition) in commits(line):
        return True
    if line.logger == "consumerkit.consumer.offsets":
        return line.text.startswith(f"{topic}/{partition}:")
    return line.logger == "consumerkit.consumer" and (
        f"('{topic}', {partition})" in line.text)


def explain(lines: Sequence[Line], topic: str, partition: int, offset: int) -> list[str]:
    """The first commit past ``offset``, and what its process said of the partition before."""
    for i, line in enumerate(lines):
        committed = commits(line).get((topic, partition))
        if committed is not None and committed > offset:
            story = [other for other in lines[:i] if other.process == line.process
                     and about(other, topic, partition)]
            # back to the start of this ownership, and one before it
            starts = [j for j, other in enumerate(story) if "first offset" in other.text]
            story = story[starts[-2] if len(starts) > 1 else 0:] if starts else story[-40:]
            return [f"{topic}/{partition}:{offset}: first committed past by {line.process} "
                    f"at {line.at} ({line.text.split()[0]} {committed})",
                    *(f"  {s.at} {s.process} {s.text}" for s in story[-60:]),
                    f"  {line.at} {line.process} {line.text}"]
    return [f"{topic}/{partition}:{offset}: no commit went past it"]


_FIRST = re.compile(r"^(\S+)/(\d+): first offset of this ownership (\d+)(?: \(committed: \w+\))?$")
_AGAIN = re.compile(r"^(\S+)/(\d+): offsets missing from (\d+), read again$")
_HIDDEN = re.compile(r"records a second read returned where the first had a gap "
                     r"\(from offset \d+\): (\d+);")
_EXPLAINED = re.compile(r"gaps passed at once, the client having skipped them .*: (\d+)$")


def late_starts(lines: Sequence[Line]) -> list[str]:
    """Ownerships that began past the last commit of their partition, sent or answered, by
    any consumer, and did not read the partition again from there: on a topic without
    transactions the records between were skipped (a commit is logged before it is sent)."""
    last: dict[tuple[str, int], tuple[int, Line]] = {}
    pending: dict[tuple[str, tuple[str, int]], tuple[int, str]] = {}  # (process, partition)
    found = []
    for line in lines:
        for part, off in commits(line).items():
            if line.text.startswith("committed ") or off > last.get(part, (-1, line))[0]:
                last[part] = (off, line)
        if line.logger != "consumerkit.consumer.offsets":
            continue
        if (m := _FIRST.match(line.text)) is not None:
            part, first = (m[1], int(m[2])), int(m[3])
            if (key := (line.process, part)) in pending:
                found.append(pending.pop(key)[1])
            off, by = last.get(part, (0, line))
            if first > off:
                pending[key] = (off, f"{line.at} {line.process} {part[0]}/{part[1]} began at "
                                     f"{first}, last commit {off} ({by.process} at {by.at})")
        elif (m := _AGAIN.match(line.text)) is not None and (
                key := (line.process, (m[1], int(m[2])))) in pending:
            off, text = pending.pop(key)
            if int(m[3]) > off:  # else it read the records it had skipped after all
                found.append(text)
    return found + [text for _, text in pending.values()]


def rereads(workdir: Path) -> tuple[int, int, int]:
    """How many times the consumers read a gap again, how many records those second reads
    returned where the first had a gap (records the broker had hidden), and how many gaps
    they passed at once, the client having skipped them (transaction markers)."""
    again = hidden = explained = 0
    for path in sorted(workdir.glob("consumer-*.log")):
        with path.open(errors="replace") as f:
            for raw in f:
                if raw.endswith(", read again\n"):
                    again += 1
                elif (m := _HIDDEN.search(raw)) is not None:
                    hidden += int(m[1])
                elif (m := _EXPLAINED.search(raw)) is not None:
                    explained += int(m[1])
    return again, hidden, explained


def parse_position(text: str) -> tuple[str, int, int]:
    topic, _, rest = text.rpartition("/")
    partition, _, offset = rest.partition(":")
    return topic, int(partition), int(offset)


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.torture.trace",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("workdir", type=Path)
    parser.add_argument("positions", nargs="*", type=parse_position,
                        help="TOPIC/PARTITION:OFFSET of a lost event")
    parser.add_argument("--late-starts", action="store_true",
                        help="list the ownerships that began past their partition's last commit")
    args = parser.parse_args(list(argv) if argv is not None else None)
    lines = read_logs(args.workdir)
    if args.late_starts:
        print("\n".join(late_starts(lines)) or "no ownership began past its last commit")
    for topic, partition, offset in args.positions:
        print("\n".join(explain(lines, topic, partition, offset)))


if __name__ == "__main__":
    main()
