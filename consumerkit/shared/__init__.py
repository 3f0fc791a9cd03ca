"""Internal helpers the consumption engine shares with the relay, the webhook receiver,
the parking lot, the stores and the CLI: not API.

    identifiers  SQL identifiers and names: validate, quote
    dsn          DSNs and URLs: parsed as asyncpg reads them, shown without passwords
    failures     a failed attempt judged: the handler's failure or infrastructure trouble
    observing    observers, readiness, the metrics endpoint of a consumer or relay
    signals      SIGTERM / SIGINT fanned out to every runnable of the process
    faults       fail-points and mutants for the torture test (inert unless enabled)
    heap         the collector's settings for a long-running process
    aio          the event loop: uvloop when installed, else asyncio
"""
