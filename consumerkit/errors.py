"""The consumerkit error tree, every class defined in this module unless noted.

Every exception the library raises derives from :class:`ConsumerKitError`::

    ConsumerKitError
    ├── ConfigurationError        a setting, identifier or handler definition is invalid
    │   ├── HandlerDefinitionError    a handler cannot be registered or resolved
    │   │   └── UpcasterChainError        the upcasters of an event type leave a gap
    │   └── UndeclaredEventError      a handler published an event type it does not declare
    ├── MissingExtraError         an optional dependency is not installed (also an ImportError)
    ├── StartupError              a service is unreachable, a topic is missing, a migration failed
    │   ├── IdempotenceRefusedError   the broker answered but refused the idempotent producer
    │   └── ServiceStartError         a local test service did not start (also a RuntimeError;
    │                                 exported by consumerkit.testing.services)
    ├── AuthorizationError        the broker denied the client's principal a topic or group
    ├── TransportError            the broker failed an operation (commit, fetch); retriable
    │   └── RecordTooLargeError       the broker or producer refuses a record's size; permanent
    ├── DecodeError               a record cannot become an event (reason code; dead-lettered)
    ├── NotInTransactionError     the outbox was written outside a transaction
    │                             (exported by consumerkit.outbox)
    ├── NoReplicationSlotError    a delete-at-insert outbox has no replication slot reading it
    │                             (exported by consumerkit.outbox; its events would be lost)
    ├── WebhookError              a webhook delivery that may succeed later (retried)
    ├── PermanentSendError        an outbox sink's destination refused an event for good
    │                             (exported by consumerkit.outbox; the event is given up on)
    ├── ParkingError              a parked key cannot be found, or its replay stopped
    │                             (one line in the CLI)
    ├── DeadLetterError           a replay or discard of dead letters refused as a whole
    │                             (another one runs, no database, another consumer's)
    ├── HandlerSignal             control flow raised BY handlers, not a failure
    │   ├── Retry                     retry this message after ``delay`` seconds
    │   └── DeadLetter                send this message to the dead-letter destination now
    ├── CommandError              a command failed in a way its user can fix
    │                             (defined in consumerkit.cli.errors; one line, exit status 1)
    └── DemoFailed                the demo could not finish (defined in consumerkit.demo.scenario)

Not under it: the internal ``HandlerFailure`` family of
``consumerkit.shared.failures`` (``ClaimBlocked``, ``ConnectionLost``), which never reaches a
user's code.

Exceptions a handler raises that are not signals are failures: the transaction rolls back and the
message is retried with back-off, unless the exception carries ``retriable = False`` (class or
instance attribute), in which case it is dead-lettered at once.

Whose fault a failure is decides whether it spends the record's attempts or stalls the whole
consumer (:mod:`consumerkit.engine.stall`). An exception type may say so with a ``systemic``
class or instance attribute, read like ``retriable`` (:func:`marked_systemic`), on the error
or anything down its ``__cause__`` chain (the outermost mark wins):

- ``systemic = True``: every record would hit it (a service or a resource the handler needs
  is missing); the consumer stalls at once, as for a missing table, and nothing is
  dead-lettered for it;
- ``systemic = False``: the record's own fault (its data is invalid); it spends the record's
  attempts and never counts toward a stall, as PostgreSQL's data and integrity errors
  (SQLSTATE classes 22 and 23) never do.

Unmarked, a failure is the record's own unless the same error type fails the handler for many
keys in a row.
"""

from __future__ import annotations


class ConsumerKitError(Exception):
    """Root of every error raised by consumerkit."""


class ConfigurationError(ConsumerKitError):
    """A setting, an identifier or a handler definition is invalid."""


class HandlerDefinitionError(ConfigurationError):
    """A handler cannot be registered: not ``async def``, a bad payload annotation, a clash."""


class UpcasterChainError(HandlerDefinitionError):
    """The upcasters of an event type do not carry every version from 1 to its handler's
    (a step is missing, doubled, or starts at or beyond the handler's version)."""


class UndeclaredEventError(ConfigurationError):
    """A handler published, through ``ctx.publish``, an event type that its
    ``@handler(..., publishes=[...])`` does not declare: a defect of the code, never retried."""

    retriable = False


class MissingExtraError(ConsumerKitError, ImportError):
    """A feature needs an optional dependency: the message names the extra to install."""

    def __init__(self, feature: str, extra: str) -> None:
        super().__init__(f"{feature} needs the {extra!r} extra: "
                         f"pip install 'consumerkit[{extra}]'")
        self.extra = extra


class StartupError(ConsumerKitError):
    """The consumer cannot start: unreachable service, missing topic, failed migration."""


class ServiceStartError(StartupError, RuntimeError):
    """A local service (an embedded PostgreSQL, Tansu or Redis of :mod:`consumerkit.testing`)
    could not be started or did not become ready in time."""


class IdempotenceRefusedError(StartupError):
    """The broker answered but refused the idempotent producer (its ``InitProducerId``):
    a broker without it (Tansu), or a principal without the right to write idempotently
    (``denied``). ``reason`` says which; :meth:`advice` adds how to turn it off, in the
    words of whoever configures the producer (the CLI names its flag and variable)."""

    def __init__(self, reason: str, *, denied: bool) -> None:
        self.reason = reason
        self.denied = denied
        super().__init__(self.advice("enable_idempotence=False in the producer's Kafka options"))

    def advice(self, setting: str) -> str:
        """The message, naming ``setting`` as the way to turn the idempotent producer off."""
        return f"{self.reason}; {'or ' if self.denied else ''}turn it off with {setting}"


class AuthorizationError(ConsumerKitError):
    """The broker denied the client's principal a topic or a group: an ACL is missing. The
    message names the principal, the resource and the operation to allow."""

    retriable = False


class TransportError(ConsumerKitError):
    """The broker failed an operation such as an offset commit; the caller may retry."""


class RecordTooLargeError(TransportError):
    """A record exceeds the producer's ``max_request_size`` or the broker's size limit.

    Sending the same record again can never succeed, so unlike other transport errors it is
    not retriable: the dead-letter writer sends a reduced entry instead (value dropped).
    """

    retriable = False


class DecodeError(ConsumerKitError):
    """A record cannot be turned into an event. ``reason`` is a stable, machine-readable code."""

    retriable = False

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class NotInTransactionError(ConsumerKitError):
    """The outbox was written outside a transaction: the event would not commit or roll back
    with the caller's business writes."""


class NoReplicationSlotError(ConsumerKitError):
    """An event was added to an outbox that deletes each row as it inserts it
    (``delete_after_insert``) while no logical replication slot reads that outbox: nothing
    would ever see the event. Create the slot (``consumerkit migrate --outbox-cdc``) before
    the first event. Every record would hit it: it stalls a consumer rather than
    dead-lettering its records."""

    systemic = True


class WebhookError(ConsumerKitError):
    """A delivery that may succeed later: a timeout, a connection failure, or an answer of
    408, 429 or 5xx. The relay retries it after its back-off.

    ``status`` is the answer's status code (``None`` when no answer came); ``retry_after``
    the seconds the receiver asked the sender to wait (``None`` if it did not say).
    """

    def __init__(self, message: str, *, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


class PermanentSendError(ConsumerKitError):
    """An outbox sink's destination refused the event for good (a 4xx from a webhook, a record
    the broker will never take): retrying cannot help, the event goes straight to FAILED."""


class ParkingError(ConsumerKitError):
    """A parked key cannot be found, is ambiguous, or its replay stopped (one line)."""


class DeadLetterError(ConsumerKitError):
    """A replay or discard of dead letters refused as a whole: another one of the same
    partitions runs, no database is configured, or the entries are another consumer's."""


class HandlerSignal(ConsumerKitError):
    """Base of the control-flow exceptions a handler may raise."""


class Retry(HandlerSignal):
    """Roll back and retry this message, after ``delay`` seconds if given (else the back-off)."""

    def __init__(self, delay: float | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class DeadLetter(HandlerSignal):
    """Roll back and send this message to the dead-letter destination without further retries."""

    retriable = False

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_retriable(exc: BaseException) -> bool:
    """Whether a handler failure may be retried (``retriable = False`` opts out)."""
    return bool(getattr(exc, "retriable", True))


def marked_systemic(exc: BaseException) -> bool | None:
    """How ``exc`` marks itself: ``True`` every record would hit it, ``False`` it is the
    record's own fault, ``None`` unmarked (its ``systemic`` attribute, class or instance)."""
    marked = getattr(exc, "systemic", None)
    return None if marked is None else bool(marked)
