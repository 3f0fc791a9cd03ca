"""The consumption engine: internal, not API (import from :mod:`consumerkit`).

A record's way, one module per step::

    run          a consumer's run wired: what it opens before the engine, closes after
    runner       fetch from the broker, hand records to keyed lanes, have the watermarks
                 committed (through :mod:`consumerkit.offsets`)
      ownership    a partition's ownership begun and ended: rebalances, rewinds, drain
    decode       broker record -> routed, validated event, or a reason it is not one
    lanes        per-key order: one group of a key at a time, keys concurrently
    pipeline     one record: park, decode, apply, retry or stall, dead letter, settle
      unapplied    a record ended without its effect: parked with its key, dead-lettered
      outcome      how a record left the pipeline
      connections  the pool connection and concurrency slot of an attempt
    apply        one transaction: claim the ids, the handlers, ``ctx.defer`` writes
                 (deferred), the check that it is still the claiming transaction (xact),
                 COMMIT
    batch        many records of many lanes in one such transaction
    settle       each record's outcome once its batch ended
    offsets      (:mod:`consumerkit.offsets`) the watermark, stored and committed

Around the flow: stall (failures every record would hit, waited out), lag, upkeep (the
dedup table over the consumer's life), lifecycle (pools and tasks opened and closed),
configure (the consumer's values from code or settings), frozen (fast per-record objects).
Helpers shared with the relay and the CLI are in :mod:`consumerkit.shared`.
"""
