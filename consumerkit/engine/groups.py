"""A group of records waiting for a batch, and how the batcher settles a submitted one.

A group is consecutive records of one key. One awaited by
:meth:`~consumerkit.engine.batch.Batcher.process` gets its batch's result through a future;
one submitted from task-less lanes is settled by :class:`Groups` when its batch ends: what
settles at once is reported to its :class:`~consumerkit.engine.settle.Owner` there, and only
what has to wait (a fallback one by one, a dead letter, a parked key) gets a task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass

from ..envelope import RecordLike
from .decode import Decoded
from .pipeline import Pipeline
from .settle import Body, Owner, Result, RolledBack, accounted, conclude, settle_now


@dataclass(slots=True, eq=False)
class Group:
    items: list[Decoded]
    abandon: asyncio.Event
    # a group awaited by process(): its result comes through the future
    future: asyncio.Future[Result] | None = None
    # a group submitted from lanes: settled by the batcher itself
    owner: Owner | None = None
    lane: Hashable = None
    records: list[RecordLike] | None = None
    good: list[tuple[RecordLike, Decoded]] | None = None
    concluded: bool = False
    batch: asyncio.Task[None] | None = None  # the batch applying it, once taken

    def done(self) -> bool:
        return self.future.done() if self.future is not None else self.concluded


class Groups:
    """Hands groups their batch's result, and runs the tasks of those that have to wait."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.errors: list[BaseException] = []  # bugs met while settling a group
        self.running: set[asyncio.Task[None]] = set()
        self.closing = False

    def deliver(self, group: Group, result: Result) -> None:
        """Hand a group its batch's result: to the task awaiting it, or settle it here."""
        if group.future is not None:
            group.future.set_result(result)
            return
        group.concluded = True
        owner, good, records = group.owner, group.good, group.records
        assert owner is not None
        assert good is not None
        assert records is not None
        try:
            at = 0
            if isinstance(result, RolledBack):
                if group.abandon.is_set():  # revoked or stopping: its new owner applies it
                    self.pipeline.observe.abandoned(records)
                    owner.finished(group.lane, records)
                    return
                rest: Result = result
            else:
                at = settle_now(self.pipeline, good, result, 0, owner.report)
                if at == len(good):
                    owner.finished(group.lane, records)
                    return
                rest = result[at:]  # from an expired record, bound for the dead letters
            left, pipeline = good[at:], self.pipeline
            self.spawn(group.lane, records[at:], owner,
                       lambda _, abandon, report: conclude(pipeline, left, rest, abandon, report),
                       whole=records)
        except Exception as exc:  # a bug: kept for the engine, which stops on it
            self.errors.append(exc)

    def cancel(self, group: Group) -> None:
        """The batcher is closing: the group's records are abandoned."""
        if group.future is not None:
            group.future.cancel()
        elif not group.concluded:
            group.concluded = True
            assert group.owner is not None
            assert group.records is not None
            self.pipeline.observe.abandoned(group.records)
            group.owner.finished(group.lane, group.records)

    def spawn(self, lane: Hashable, records: list[RecordLike], owner: Owner,
              body: Body, whole: list[RecordLike] | None = None) -> None:
        """Settle ``records`` of a submitted group in a task (they have to wait), then tell
        ``owner`` the group (``whole``, if more) is finished."""
        async def settle() -> None:
            try:
                await accounted(self.pipeline, records, owner.abandon, owner.report, body)
            except asyncio.CancelledError:
                if self.closing or not owner.abandon.is_set():
                    raise
                task = asyncio.current_task()  # revoked and cut short: the lane gives up
                if task is not None:
                    task.uncancel()
            except Exception as exc:  # a bug, or a refusal nothing can wait out (a missing
                self.errors.append(exc)  # grant): the consumer stops on it, the lane with it
                raise

        def ended(task: asyncio.Task[None]) -> None:
            # a done callback: it runs even for a task cancelled before its first step
            if task.cancelled() or task.exception() is None:
                owner.finished(lane, whole if whole is not None else records)

        task = asyncio.create_task(settle())
        owner.running.add(task)
        self.running.add(task)
        task.add_done_callback(owner.running.discard)
        task.add_done_callback(self.running.discard)
        task.add_done_callback(ended)
