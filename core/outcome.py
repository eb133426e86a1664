"""The words for what an attempt did, one vocabulary from the try to the reply to the
record (docs/design.md, "Words"): ``Outcome``, how an attempt ended, and ``Applied``,
what it may have done.

An agent's runner ends an attempt in one of the four outcomes an agent reports
(``REPORTED``); the supervisor and the scheduler add the two no agent reports
(``expired``: no report by the deadline; ``not-sent``: the request never left). The
record keeps the same word (``core.attempts.Attempt.ending``), the history and the console
show it. One word differs on the wire, and only there: contract 3.3 fixes ``failed`` for a
refusal in a reply's ``outcome`` (``Outcome.wire``, ``Outcome.of_wire``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

#: How rows written before 2026-11 named a transient ending (``Outcome.TRANSIENT``).
LEGACY_TRANSIENT: Final = "failed"


class Outcome(StrEnum):
    """How an attempt ended."""

    SUCCEEDED = "succeeded"  # 2xx (for a call answered by callback: the remote accepted)
    REFUSED = "refused"  # the remote refused: nothing applied by that try
    TRANSIENT = "transient"  # transient failures until the time ran out: counted
    DEFERRED = "deferred"  # not called, or the remote down for everyone: not counted
    EXPIRED = "expired"  # no report by its deadline: counted
    NOT_SENT = "not-sent"  # its request never left (or expired unread): not counted

    @classmethod
    def _missing_(cls, value: object) -> Outcome | None:
        # A stored attempt of before 2026-11 said "failed" for a transient ending.
        return cls.TRANSIENT if value == LEGACY_TRANSIENT else None

    @property
    def wire(self) -> str:
        """The word a reply carries (contract 3.3: ``failed`` for a refusal)."""
        return "failed" if self is Outcome.REFUSED else self.value

    @classmethod
    def of_wire(cls, word: str) -> Outcome:
        """The outcome a reply's word names (``failed``: refused); ``ValueError`` for a word
        no reply carries."""
        found = _WIRE.get(word)
        if found is None:
            raise ValueError(f"{word!r} is no reply's outcome ({', '.join(_WIRE)})")
        return found


#: What an agent reports (a reply's outcome).
REPORTED: Final = (Outcome.SUCCEEDED, Outcome.REFUSED, Outcome.TRANSIENT, Outcome.DEFERRED)
_WIRE: Final = {o.wire: o for o in REPORTED}
#: A reply's outcome as the wire spells it.
WIRE_OUTCOMES: Final = tuple(_WIRE)


class Applied(StrEnum):
    """What an attempt (or one try of it) may have done to the remote."""

    NO = "no"
    MAYBE = "maybe"
    YES = "yes"
    UNKNOWN = "unknown"  # no report yet (an expiry assumes it may have)

    @property
    def doubtful(self) -> bool:
        return self in (Applied.MAYBE, Applied.UNKNOWN)
