"""Which Storage queues may receive an order's status notices (``REPLY_QUEUES``).

An order names its ``replyTo`` queue, so without a rule anyone who can post an order could
make the app write to any queue of its storage account. The setting lists the queues
allowed: comma-separated names, an entry ending in ``*`` being a prefix
(``shop-status,partner-*``). Empty (the default): no order may name a ``replyTo``. The app's
own queues are never allowed, whatever the setting says (``Names.is_own_queue``), and the
app never creates a ``replyTo`` queue: a notice for a queue that does not exist is not sent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

SETTING: Final = "REPLY_QUEUES"

#: A Storage queue name: 3-63 lowercase letters, digits and single hyphens.
QUEUE_NAME: Final = re.compile(r"(?=.{3,63}\Z)[a-z0-9]+(?:-[a-z0-9]+)*")
#: What may come before the ``*`` of a prefix entry.
_PREFIX: Final = re.compile(r"[a-z0-9-]{0,62}")


@dataclass(frozen=True)
class ReplyQueues:
    """The parsed ``REPLY_QUEUES``: exact names and prefixes."""

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str, setting: str = SETTING) -> ReplyQueues:
        names: set[str] = set()
        prefixes: list[str] = []
        for entry in (part.strip() for part in text.split(",")):
            if not entry:
                continue
            if entry.endswith("*"):
                prefix = entry[:-1]
                if not _PREFIX.fullmatch(prefix):
                    raise ValueError(
                        f"{setting}: {entry!r} is not a queue name prefix: lowercase letters, "
                        "digits and hyphens, then one '*' at the end (e.g. shop-status-*)"
                    )
                prefixes.append(prefix)
            elif QUEUE_NAME.fullmatch(entry):
                names.add(entry)
            else:
                raise ValueError(
                    f"{setting}: {entry!r} is not a Storage queue name (3-63 lowercase letters, "
                    "digits and single hyphens) nor a prefix ending in '*'"
                )
        return cls(frozenset(names), tuple(dict.fromkeys(prefixes)))

    @property
    def empty(self) -> bool:
        return not self.names and not self.prefixes

    def allows(self, queue: str) -> bool:
        return queue in self.names or any(queue.startswith(p) for p in self.prefixes)

    def refusal(self, queue: str) -> str | None:
        """Why ``queue`` may not receive status notices (a sentence naming the setting), or
        None when the setting lists it."""
        if self.allows(queue):
            return None
        if self.empty:
            return (
                f"replyTo {queue!r} is not allowed: this deployment sends status messages to no "
                f"queue ({SETTING} is empty); send the order without replyTo, or ask the "
                f"operator to add the queue to {SETTING}"
            )
        return (
            f"replyTo {queue!r} is not allowed: {SETTING} ({self}) does not list it; send the "
            f"order without replyTo, or ask the operator to add the queue to {SETTING}"
        )

    def __str__(self) -> str:
        return ",".join([*sorted(self.names), *(f"{p}*" for p in self.prefixes)])
