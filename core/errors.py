"""One error hierarchy. Each error says whether retrying can help, and carries
the order and step it is about, so a log line or an HTTP body can name them."""

from __future__ import annotations


def _rebuild(cls: type[OrderError], state: dict[str, object]) -> OrderError:
    error = cls.__new__(cls)
    error.__dict__.update(state)
    error.args = (state.get("message", ""),)
    return error


class OrderError(Exception):
    """Base of every domain error."""

    retryable: bool = False

    def __init__(self, message: str, *, order_id: str | None = None, step: str | None = None):
        super().__init__(message)
        self.message = message
        self.order_id = order_id
        self.step = step

    def __reduce__(self) -> tuple[object, ...]:
        # Picklable whatever the subclass' constructor (errors cross process pools).
        return (_rebuild, (type(self), dict(self.__dict__)))


class InvalidOrder(OrderError):
    """An order message that can never be accepted; ``str(error)`` is the reason for a person."""


class InvalidMessage(OrderError):
    """A transport message (agent request or reply) that cannot be decoded; never retried."""


class OrderNotFound(OrderError):
    pass


class AgentNotFound(OrderError):
    """An agent name that the declarations do not declare (``core.workflows.AGENTS``)."""


class InvalidContinuationToken(ValueError):
    """A ``continuationToken`` the store did not hand out (forged, cut or mangled): a 400."""


class OrderAlreadyExists(OrderError):
    """Raised by the store when creating an order whose id is taken."""


class ConcurrencyConflict(OrderError):
    """Someone else changed the order first (ETag mismatch): reload and decide again."""

    retryable = True


class TransitionRefused(OrderError):
    """The requested change does not apply to the order in its current state.

    Not a failure of the system: a claim on a step someone else holds, a reply
    for an attempt that is over, a resubmit of an order that is not in error.
    ``reason`` is a short machine-friendly code, the message a sentence.
    """

    def __init__(
        self, reason: str, message: str, *, order_id: str | None = None, step: str | None = None
    ):
        super().__init__(message, order_id=order_id, step=step)
        self.reason = reason


class OrderChanged(OrderError):
    """An operator's change made against a version of the order that is no longer the
    latest (``If-Match``): nothing changes; read it again (a 412)."""


class UnboundMessage(OrderError):
    """An agent request or reply that no claim speaks for: no such order, step or attempt,
    or a token that is not the attempt's own (docs/contracts.md §3.3). Never applied and
    never run: the message is quarantined, which alerts an operator."""


class DuplicateRequest(OrderError):
    """Another copy of an agent request already took its attempt (Storage queues, which
    detect no duplicates: ``Order.take``): this copy calls nothing and reports nothing."""


class InvalidEvent(OrderError):
    """An event the order cannot take: a name its workflow does not declare, or a body that
    is neither ``{"result": {...}}`` nor ``{"refused": "..."}`` (a 400, whatever the
    order's state)."""


class Forbidden(OrderError):
    """Who delivers is not who may (docs/contracts.md §3.15, "who may answer"): a person's
    decision from no person, a remote's callback without the capability of its run, or
    with another's (a 403, whatever key came with it)."""


class StorageUnavailable(OrderError):
    """The state store or a queue did not answer (after its own retries)."""

    retryable = True


class QueueMissing(OrderError):
    """A send to a queue that does not exist, where the app may not create it (an order's
    ``replyTo``: docs/contracts.md §3.5, ``REPLY_QUEUES``). Retrying cannot help."""


class CorruptOrder(OrderError):
    """An order's stored records cannot be read back (a property missing or malformed,
    by a manual edit, a bad restore or a bug): retrying cannot help, a person must look."""
