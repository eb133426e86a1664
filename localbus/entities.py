"""Queues as Service Bus keeps them: peek-lock, delivery counts, dead-lettering, expiry and
duplicate detection. Pure: no AMQP, no threads, every operation takes ``now`` (epoch seconds),
so the rules are tested on a fake clock. ``localbus.broker`` maps AMQP onto these.

The rules, as Service Bus documents them (and the contract tests check against a real
namespace when one is configured):

- ``delivery_count`` is the number of earlier deliveries under a lock that did not end in
  a settlement: 0 on the first delivery; +1 when the receiver abandons the message or its
  lock expires; unchanged when the receiver *releases* it (the SDK releases messages that
  reach it outside a receive call).
- When ``delivery_count`` reaches ``max_delivery_count`` the message goes to the
  dead-letter sub-queue (reason ``MaxDeliveryCountExceeded``), so a message is delivered
  ``max_delivery_count`` times at most.
- A message's time to live is its own, capped by the queue's default; once it has passed,
  the message is never delivered again: dead-lettered (``TTLExpiredException``) when the
  queue dead-letters on expiration, dropped otherwise. A locked message is not expired
  while its lock holds (it can still be completed); it expires when the lock ends.
- A ``message_id`` seen within ``duplicate_window`` is accepted and dropped (a scheduled
  message's id is checked when it is sent).
- A message sent with a scheduled enqueue time in the future is invisible to receivers
  until then (never earlier); then it is enqueued as if sent at that time: its enqueued
  time and its time to live count from it, and it queues behind what was enqueued before
  (FIFO by enqueue time). ``peek`` shows it meanwhile, as Service Bus does.
- Dead-lettered messages keep their body and properties, get ``DeadLetterReason`` and
  ``DeadLetterErrorDescription``, never expire and are never dead-lettered again.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

#: The dead-letter sub-queue, as the SDK and the Functions host name it.
DEAD_LETTER_SUFFIX = "/$DeadLetterQueue"
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"
TTL_EXPIRED_REASON = "TTLExpiredException"


class LockLost(Exception):
    """The lock token is unknown or its lock has expired (``com.microsoft:message-lock-lost``)."""


@dataclass(frozen=True)
class QueueConfig:
    """A queue's properties. The defaults are infra/app/servicebus.bicep's."""

    name: str
    max_delivery_count: int = 5
    lock_duration: float = 30.0
    default_ttl: float = 3600.0
    duplicate_window: float = 600.0
    dead_letter_on_expiration: bool = True
    duplicate_detection: bool = True

    #: ``--queues`` spelling of each property (``name:key=value:key=value``).
    OPTIONS = {
        "max-delivery-count": "max_delivery_count",
        "lock-duration": "lock_duration",
        "default-ttl": "default_ttl",
        "duplicate-window": "duplicate_window",
        "dead-letter-on-expiration": "dead_letter_on_expiration",
        "duplicate-detection": "duplicate_detection",
    }

    @classmethod
    def parse(cls, spec: str) -> QueueConfig:
        """``orders`` or ``orders:lock-duration=5:max-delivery-count=3`` (seconds for times)."""
        name, *options = [part.strip() for part in spec.split(":")]
        if not name or "/" in name:
            raise ValueError(f"queue {spec!r}: a name without '/' is needed")
        values: dict[str, Any] = {}
        for option in options:
            key, _, raw = option.partition("=")
            attribute = cls.OPTIONS.get(key)
            if attribute is None:
                known = ", ".join(cls.OPTIONS)
                raise ValueError(f"queue {name}: unknown option {key!r} (known: {known})")
            if attribute in ("dead_letter_on_expiration", "duplicate_detection"):
                if raw.lower() not in ("true", "false"):
                    raise ValueError(f"queue {name}: {key} must be true or false, not {raw!r}")
                values[attribute] = raw.lower() == "true"
            elif attribute == "max_delivery_count":
                values[attribute] = int(raw)
            else:
                values[attribute] = float(raw)
        config = cls(name, **values)
        if config.max_delivery_count < 1 or config.lock_duration <= 0 or config.default_ttl <= 0:
            raise ValueError(f"queue {name}: counts and durations must be positive")
        return config


@dataclass
class Stored:
    """One message in a queue. ``payload`` is whatever the broker keeps (opaque here)."""

    sequence_number: int
    payload: Any
    message_id: str | None
    enqueued_at: float
    ttl: float | None  # the message's own time to live, seconds (None: the queue's default)
    expires_at: float
    delivery_count: int = 0
    lock_token: uuid.UUID | None = None
    locked_until: float = 0.0
    dead_letter_reason: str | None = None
    dead_letter_description: str | None = None


@dataclass
class Entity:
    """A queue, or a queue's dead-letter sub-queue (``dead_letters`` is then None)."""

    config: QueueConfig
    path: str
    dead_letters: Entity | None = None
    #: Waiting to be delivered, by sequence number (an abandoned message keeps its place).
    available: OrderedDict[int, Stored] = field(default_factory=OrderedDict)
    locked: dict[uuid.UUID, Stored] = field(default_factory=dict)
    seen_ids: dict[str, float] = field(default_factory=dict)  # message_id -> first seen
    #: Sent with a scheduled enqueue time still ahead, by sequence number.
    scheduled: dict[int, Stored] = field(default_factory=dict)

    @property
    def is_dead_letter_queue(self) -> bool:
        return self.dead_letters is None

    # -- sending ---------------------------------------------------------------------------

    def enqueue(
        self,
        payload: Any,
        message_id: str | None,
        ttl: float | None,
        now: float,
        sequence: int,
        scheduled_at: float | None = None,
    ) -> Stored | None:
        """Store a sent message; None when it is a duplicate (accepted and dropped).
        ``scheduled_at`` (epoch seconds) still ahead: kept out of sight until then."""
        if self.config.duplicate_detection and message_id is not None:
            self._forget_old_ids(now)
            if message_id in self.seen_ids:
                return None
            self.seen_ids[message_id] = now
        at = scheduled_at if scheduled_at is not None and scheduled_at > now else now
        lifetime = self.config.default_ttl if not ttl else min(ttl, self.config.default_ttl)
        stored = Stored(sequence, payload, message_id, at, ttl, at + lifetime)
        if at > now:
            self.scheduled[sequence] = stored
        else:
            self._put_back(stored)
        return stored

    def activate(self, now: float) -> None:
        """Enqueue the scheduled messages whose time has come, in the order of their times."""
        due = sorted(
            (s for s in self.scheduled.values() if s.enqueued_at <= now),
            key=lambda s: (s.enqueued_at, s.sequence_number),
        )
        for stored in due:
            del self.scheduled[stored.sequence_number]
            self._put_back(stored)

    def _forget_old_ids(self, now: float) -> None:
        horizon = now - self.config.duplicate_window
        for message_id in [m for m, at in self.seen_ids.items() if at <= horizon]:
            del self.seen_ids[message_id]

    def _put_back(self, stored: Stored) -> None:
        stored.lock_token, stored.locked_until = None, 0.0
        last = self.available[next(reversed(self.available))] if self.available else None
        self.available[stored.sequence_number] = stored
        if last is not None and _order(last) > _order(stored):  # keep enqueue order
            self.available = OrderedDict(
                sorted(self.available.items(), key=lambda item: _order(item[1]))
            )

    # -- receiving -------------------------------------------------------------------------

    def take(self, now: float, *, lock: bool) -> Stored | None:
        """The next deliverable message: locked (peek-lock) or removed (receive-and-delete)."""
        self.activate(now)
        self.expire(now)
        if not self.available:
            return None
        _, stored = self.available.popitem(last=False)
        if lock:
            stored.lock_token = uuid.uuid4()
            stored.locked_until = now + self.config.lock_duration
            self.locked[stored.lock_token] = stored
        return stored

    def peek(self, from_sequence: int, count: int) -> list[Stored]:
        """Messages from a sequence number on, locked, scheduled or not, without locking
        them."""
        everything = sorted(
            [*self.available.values(), *self.locked.values(), *self.scheduled.values()],
            key=lambda s: s.sequence_number,
        )
        return [s for s in everything if s.sequence_number >= from_sequence][:count]

    def _locked(self, token: uuid.UUID, now: float) -> Stored:
        stored = self.locked.get(token)
        if stored is None or stored.locked_until <= now:
            raise LockLost(f"the lock {token} is lost (expired, or the message was settled)")
        return stored

    def renew(self, token: uuid.UUID, now: float) -> float:
        stored = self._locked(token, now)
        stored.locked_until = now + self.config.lock_duration
        return stored.locked_until

    def complete(self, token: uuid.UUID, now: float) -> Stored:
        stored = self._locked(token, now)
        del self.locked[token]
        return stored

    def release(self, token: uuid.UUID, now: float) -> None:
        """Back to the queue as if never delivered (AMQP ``released``)."""
        stored = self._locked(token, now)
        del self.locked[token]
        self._put_back(stored)

    def abandon(self, token: uuid.UUID, now: float) -> None:
        """A failed delivery: counted; dead-lettered at the queue's max delivery count."""
        stored = self._locked(token, now)
        del self.locked[token]
        self._failed_delivery(stored)

    def dead_letter(
        self, token: uuid.UUID, now: float, reason: str | None, description: str | None
    ) -> None:
        stored = self._locked(token, now)
        del self.locked[token]
        self._to_dead_letters(stored, reason, description)

    def _failed_delivery(self, stored: Stored) -> None:
        stored.delivery_count += 1
        if (
            self.dead_letters is not None
            and stored.delivery_count >= self.config.max_delivery_count
        ):
            self._to_dead_letters(
                stored,
                MAX_DELIVERY_REASON,
                f"Message could not be consumed after {self.config.max_delivery_count} "
                "delivery attempts.",
            )
        else:
            self._put_back(stored)

    def _to_dead_letters(self, stored: Stored, reason: str | None, description: str | None) -> None:
        if self.dead_letters is None:  # a dead-letter queue has no dead-letter queue
            self._put_back(stored)
            return
        stored.dead_letter_reason, stored.dead_letter_description = reason, description
        stored.expires_at = float("inf")
        self.dead_letters._put_back(stored)

    # -- time ------------------------------------------------------------------------------

    def expire(self, now: float) -> None:
        """End lapsed locks (a failed delivery each), then expire messages past their TTL."""
        for token in [t for t, s in self.locked.items() if s.locked_until <= now]:
            self._failed_delivery(self.locked.pop(token))
        for number in [n for n, s in self.available.items() if s.expires_at <= now]:
            stored = self.available.pop(number)
            if self.config.dead_letter_on_expiration and self.dead_letters is not None:
                self._to_dead_letters(
                    stored,
                    TTL_EXPIRED_REASON,
                    "The message expired and was dead lettered.",
                )


def _order(stored: Stored) -> tuple[float, int]:
    """Where a message waits: by enqueue time (a scheduled one's is its time), then sent."""
    return stored.enqueued_at, stored.sequence_number


def make_queue(config: QueueConfig) -> Entity:
    """A queue and its dead-letter sub-queue."""
    dead_letters = Entity(config, config.name + DEAD_LETTER_SUFFIX)
    return Entity(config, config.name, dead_letters)
