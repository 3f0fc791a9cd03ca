"""The consumption engine: internal, not API (import from :mod:`consumerkit`).

A record's path, in order, one module per step::

    fetch        a poll's records, each with the ownership of its partition; the dedup
                 cache asked once which were applied before
    runner       the fetch loop: records handed to keyed lanes, room waited for, the
                 watermarks committed (:class:`~consumerkit.engine.runner.Engine`)
    lanes        per-key order: one group of a key at a time, keys concurrently
    batch        the groups of many lanes gathered into one transaction
      groups       a group waiting for its batch, and how a submitted one settles
    pipeline     one record: park, decode, apply, retry or stall, dead letter
      decode       broker record -> routed, validated event, or a reason it is not one
      stall        failures every record would hit, waited out by the whole consumer
      systemic     whose fault a failure is: every record's, or the record's own
      unapplied    a record ended without its effect: parked with its key, dead-lettered
    apply        the transaction: cache, BEGIN, claim the ids, the handlers, COMMIT
      handling     the handler calls (in plan's order), ``ctx.defer`` writes (deferred),
                   the check that it is still the claiming transaction (xact)
    settle       each record's outcome once its batch ended
    offsets      (:mod:`consumerkit.offsets`) the watermark, stored and committed

Beside the path: ownership (a partition's ownership begun and ended: rebalances, rewinds,
the drain at stop), connections (a transaction's connection and concurrency slot), outcome
(how a record left the pipeline), unhandled (event types no handler takes), cdc (Kafka
Connect's wrapping undone), frozen (fast per-record objects).

The run's wiring, not the record's path: run (what a run opens before the engine and closes
after), configure (the consumer's values from code or settings), lifecycle (pools and tasks
opened and closed), upkeep (the dedup table over the consumer's life), observing (observers,
readiness), lag. The commands' side: dead_letters, dead_letter_apply and replay (dead letters
and parked keys applied again or discarded). Helpers shared with the relay and the CLI are in
:mod:`consumerkit.shared`; fail-points and mutants go through one hook,
:func:`consumerkit.shared.faults.inject`.
"""
