"""localbus's queue rules on a fake clock (no AMQP): ``localbus.entities``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localbus.entities import (
    MAX_DELIVERY_REASON,
    TTL_EXPIRED_REASON,
    LockLost,
    QueueConfig,
    make_queue,
)

BICEP = Path(__file__).resolve().parents[2] / "infra" / "app" / "servicebus.bicep"


def queue(**options: object) -> object:
    return make_queue(QueueConfig("q", **options))  # type: ignore[arg-type]


def test_the_defaults_are_the_infra_queues() -> None:
    text = BICEP.read_text()

    def iso_seconds(key: str) -> float:
        value = re.search(rf"{key}: 'PT(\d+)([SMH])'", text)
        assert value, key
        return int(value.group(1)) * {"S": 1, "M": 60, "H": 3600}[value.group(2)]

    config = QueueConfig("q")
    assert config.lock_duration == iso_seconds("lockDuration")
    assert config.duplicate_window == iso_seconds("duplicateDetectionHistoryTimeWindow")
    assert config.default_ttl == iso_seconds("defaultMessageTimeToLive")
    count = re.search(r"maxDeliveryCount: (\d+)", text)
    assert count and config.max_delivery_count == int(count.group(1))
    assert "requiresDuplicateDetection: true" in text and config.duplicate_detection


def test_queue_specs_parse_and_bad_ones_are_refused() -> None:
    config = QueueConfig.parse(
        "jobs:lock-duration=5:max-delivery-count=3:dead-letter-on-expiration=false"
    )
    assert (config.name, config.lock_duration, config.max_delivery_count) == ("jobs", 5.0, 3)
    assert config.dead_letter_on_expiration is False
    for bad in (
        "",
        "a/b",
        "jobs:colour=red",
        "jobs:lock-duration=0",
        "jobs:duplicate-detection=maybe",
    ):
        with pytest.raises(ValueError):
            QueueConfig.parse(bad)


def test_abandon_counts_and_the_max_dead_letters() -> None:
    q = make_queue(QueueConfig("q", max_delivery_count=2))
    q.enqueue("m", "id-1", None, 0.0, 1)
    first = q.take(0.0, lock=True)
    assert first is not None and first.delivery_count == 0 and first.lock_token
    q.abandon(first.lock_token, 0.0)
    second = q.take(0.0, lock=True)
    assert second is first and second.delivery_count == 1 and second.lock_token
    q.abandon(second.lock_token, 0.0)
    assert q.take(0.0, lock=True) is None
    assert q.dead_letters is not None
    dead = q.dead_letters.take(0.0, lock=True)
    assert dead is first and dead.dead_letter_reason == MAX_DELIVERY_REASON


def test_release_does_not_count_and_locks_lapse_and_count() -> None:
    q = make_queue(QueueConfig("q", lock_duration=10))
    q.enqueue("m", None, None, 0.0, 1)
    taken = q.take(0.0, lock=True)
    assert taken is not None and taken.lock_token
    q.release(taken.lock_token, 1.0)
    again = q.take(1.0, lock=True)
    assert again is taken and again.delivery_count == 0 and again.lock_token
    token = again.lock_token
    assert q.renew(token, 9.0) == 19.0
    assert q.take(18.0, lock=True) is None  # still locked
    back = q.take(19.5, lock=True)  # lapsed: back, counted
    assert back is again and back.delivery_count == 1
    with pytest.raises(LockLost):
        q.complete(token, 19.5)


def test_expired_messages_are_dead_lettered_or_dropped_as_configured() -> None:
    keeps = make_queue(QueueConfig("q"))
    drops = make_queue(QueueConfig("r", dead_letter_on_expiration=False))
    for q in (keeps, drops):
        q.enqueue("m", None, 5.0, 0.0, 1)
        assert q.take(6.0, lock=True) is None
    assert keeps.dead_letters is not None and drops.dead_letters is not None
    dead = keeps.dead_letters.take(6.0, lock=True)
    assert dead is not None and dead.dead_letter_reason == TTL_EXPIRED_REASON
    assert drops.dead_letters.take(6.0, lock=True) is None


def test_a_locked_message_does_not_expire_until_its_lock_ends() -> None:
    q = make_queue(QueueConfig("q", lock_duration=10))
    q.enqueue("m", None, 5.0, 0.0, 1)
    taken = q.take(0.0, lock=True)
    assert taken is not None and taken.lock_token
    q.expire(6.0)
    q.complete(taken.lock_token, 6.0)  # still held: completes


def test_an_expired_message_takes_its_delivery_count_to_the_dead_letter_queue() -> None:
    """What supervisor/expired.py reads: a message never delivered arrives with 0; one
    whose lock ended after its expiry (lapsed, or abandoned) with that delivery counted,
    as the documented rule counts every lock that ends unsettled; and the dead-letter
    queue counts its own failed deliveries (the less kind reading: Azure may not, see
    Azure/azure-sdk-for-net#53437)."""
    q = make_queue(QueueConfig("q", lock_duration=10))
    q.enqueue("lapsed", "l", 5.0, 0.0, 1)
    q.enqueue("abandoned", "a", 5.0, 0.0, 2)
    lapsed, abandoned = q.take(0.0, lock=True), q.take(0.0, lock=True)
    assert lapsed is not None and abandoned is not None and abandoned.lock_token
    q.enqueue("never", "n", 5.0, 0.0, 3)
    q.expire(6.0)  # "never" expired; the others are locked, so not yet
    assert q.dead_letters is not None
    assert [s.payload for s in q.dead_letters.available.values()] == ["never"]
    q.abandon(abandoned.lock_token, 7.0)  # past its expiry
    q.expire(10.5)  # the lapsed lock ends past its expiry
    dead = {s.payload: s for s in q.dead_letters.available.values()}
    assert {p: s.delivery_count for p, s in dead.items()} == {
        "never": 0,
        "abandoned": 1,
        "lapsed": 1,
    }
    assert {s.dead_letter_reason for s in dead.values()} == {TTL_EXPIRED_REASON}
    first = q.dead_letters.take(20.0, lock=True)
    assert first is not None and first.payload == "lapsed" and first.lock_token
    q.dead_letters.abandon(first.lock_token, 20.0)  # the dead-letter trigger failed on it
    again = q.dead_letters.take(20.0, lock=True)
    assert again is first and again.delivery_count == 2
    later = q.dead_letters.take(40.0, lock=True)  # its lock lapsed at 30 s: counted too
    assert later is first and later.delivery_count == 3


def test_duplicates_are_dropped_within_the_window_only() -> None:
    q = make_queue(QueueConfig("q", duplicate_window=60))
    assert q.enqueue("a", "same", None, 0.0, 1) is not None
    assert q.enqueue("b", "same", None, 30.0, 2) is None
    assert q.enqueue("c", "same", None, 61.0, 3) is not None
    off = make_queue(QueueConfig("r", duplicate_detection=False))
    assert off.enqueue("a", "same", None, 0.0, 1) and off.enqueue("b", "same", None, 0.0, 2)


def test_an_abandoned_message_keeps_its_place_in_the_queue() -> None:
    q = make_queue(QueueConfig("q"))
    for n in (1, 2):
        q.enqueue(f"m{n}", None, None, 0.0, n)
    first = q.take(0.0, lock=True)
    assert first is not None and first.lock_token
    q.abandon(first.lock_token, 0.0)
    again = q.take(0.0, lock=True)
    assert again is not None and again.sequence_number == 1


def test_a_scheduled_message_waits_for_its_time_then_queues_by_it() -> None:
    q = make_queue(QueueConfig("q", default_ttl=60))
    q.enqueue("later", "s", None, 0.0, 1, scheduled_at=10.0)
    q.enqueue("now", None, None, 1.0, 2)
    assert [s.enqueued_at for s in q.scheduled.values()] == [10.0]
    first = q.take(9.999, lock=False)
    assert first is not None and first.payload == "now"
    assert q.take(9.999, lock=False) is None  # not a moment early
    assert [s.payload for s in q.peek(0, 10)] == ["later"]  # peek shows it meanwhile
    q.enqueue("after", None, None, 10.5, 3)
    woken = q.take(11.0, lock=False)
    assert woken is not None and woken.payload == "later"  # enqueued at 10, before "after"
    assert (woken.enqueued_at, woken.expires_at) == (10.0, 70.0)  # its TTL counts from 10
    assert q.enqueue("copy", "s", None, 12.0, 4, scheduled_at=20.0) is None  # a duplicate
    assert not q.scheduled
    past = q.enqueue("past", None, None, 13.0, 5, scheduled_at=12.0)  # a time gone: now
    assert past is not None and past.enqueued_at == 13.0 and not q.scheduled
