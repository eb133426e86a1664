"""Supervisor retry policy, UTC time text, and the OrderState table layout."""

from __future__ import annotations

import json
import random
import string
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

import pytest

from core.messages import AgentReply
from core.model import Order
from core.order_message import decode_order
from core.outcome import Outcome
from core.policy import RetryPolicy
from core.timefmt import ensure_utc, iso, parse_iso, sortable
from core.workflows import WORKFLOWS, Plan
from stores import layout

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)

# --- RetryPolicy ----------------------------------------------------------------------


def test_no_backoff_up_to_the_soft_threshold() -> None:
    policy = RetryPolicy(soft_threshold=2)

    assert [policy.backoff(n, "o-1") for n in range(3)] == [timedelta(0)] * 3
    assert policy.backoff(3, "o-1") > timedelta(0)


@pytest.mark.parametrize("order_id", ["o-1", "order-42", "Z"])
def test_backoff_doubles_after_the_soft_threshold_with_bounded_jitter(order_id: str) -> None:
    policy = RetryPolicy(soft_threshold=2, base_backoff_seconds=2, max_backoff_seconds=1000)

    for failures, nominal in [(3, 2), (4, 4), (5, 8), (6, 16), (7, 32), (8, 64)]:
        seconds = policy.backoff(failures, order_id).total_seconds()
        assert nominal * 0.8 <= seconds <= nominal * 1.2, (failures, seconds)


def test_backoff_is_jittered_then_capped() -> None:
    policy = RetryPolicy(soft_threshold=1, base_backoff_seconds=2, max_backoff_seconds=10)
    waits = [policy.backoff(n, f"o-{i}").total_seconds() for n in range(5, 40) for i in range(20)]

    assert all(w <= 10.0 for w in waits)  # the cap is a cap: jitter never passes it
    assert all(w >= 10.0 for w in waits[-20:])  # far past the cap, every wait is the cap


def test_jitter_is_deterministic_per_order_and_spreads_orders() -> None:
    policy = RetryPolicy(soft_threshold=0, base_backoff_seconds=10)

    assert policy.backoff(1, "o-1") == policy.backoff(1, "o-1")
    spread = {policy.backoff(1, f"o-{i}").total_seconds() for i in range(200)}
    assert min(spread) < 8.5
    assert max(spread) > 11.5
    assert len(spread) > 50  # orders that failed together do not come back together


def test_backoff_has_millisecond_resolution() -> None:
    wait = RetryPolicy().backoff(4, "o-1").total_seconds()

    assert wait == round(wait, 3)


def test_backoff_for_a_huge_failure_count_is_the_cap() -> None:
    policy = RetryPolicy(max_failure_count=5000, max_backoff_seconds=300)

    assert 240 <= policy.backoff(1100, "o-1").total_seconds() <= 360


def test_gives_up_at_the_max_failure_count() -> None:
    policy = RetryPolicy(max_failure_count=3)

    assert [policy.gives_up(n) for n in range(5)] == [False, False, False, True, True]


# --- timefmt ---------------------------------------------------------------------------


def _random_times(count: int, seed: int) -> list[datetime]:
    rng = random.Random(seed)
    start = datetime(2000, 1, 1, tzinfo=UTC)
    span = int(timedelta(days=365 * 100).total_seconds() * 1_000_000)
    out = []
    for _ in range(count):
        moment = start + timedelta(microseconds=rng.randrange(span))
        offset = timezone(timedelta(minutes=rng.randrange(-14 * 60, 14 * 60 + 1)))
        out.append(moment.astimezone(offset))
    return out


def test_iso_is_utc_with_milliseconds_and_z() -> None:
    paris = timezone(timedelta(hours=1))

    assert iso(T0) == "2026-11-22T10:00:00.000Z"
    assert iso(datetime(2026, 11, 22, 11, 0, 0, 123456, tzinfo=paris)) == (
        "2026-11-22T10:00:00.123Z"
    )
    assert all(iso(t).endswith("Z") and len(iso(t)) == 24 for t in _random_times(500, 1))


def test_iso_round_trips_at_millisecond_precision() -> None:
    for moment in _random_times(500, 2):
        exact_ms = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
        assert parse_iso(iso(moment)) == exact_ms


def test_sortable_text_order_is_time_order() -> None:
    times = _random_times(5000, 3)
    times += [t + timedelta(microseconds=1) for t in times[:200]]  # near neighbours

    by_text = sorted(times, key=sortable)
    by_time = sorted(times)

    assert [sortable(t) for t in by_text] == [sortable(t) for t in by_time]
    assert len({len(sortable(t)) for t in times}) == 1  # fixed width


def test_sortable_format() -> None:
    assert sortable(datetime(2026, 1, 2, 3, 4, 5, 60, tzinfo=UTC)) == "20260102T030405.000060Z"


@pytest.mark.parametrize("convert", [iso, sortable, ensure_utc])
def test_naive_datetimes_are_refused(convert: object) -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        convert(datetime(2026, 11, 22, 10, 0))  # type: ignore[operator]


def test_parse_iso_refuses_text_without_offset() -> None:
    with pytest.raises(ValueError, match="has no UTC offset"):
        parse_iso("2026-11-22T10:00:00")


# --- layout: keys ----------------------------------------------------------------------


def test_shard_of_is_stable_across_releases() -> None:
    # Changing the hash re-homes every stored order: these values must never change.
    assert layout.shard_of("o-1") == "shard-04"
    assert layout.shard_of("order-42") == "shard-07"
    assert layout.shard_of("A") == "shard-00"
    assert layout.shard_of("x" * 64) == "shard-07"


def test_shards_are_in_range_and_roughly_uniform() -> None:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "-_"
    ids = {"".join(rng.choices(alphabet, k=rng.randint(1, 64))) for _ in range(10_000)}
    ids |= {f"order-{n}" for n in range(10_000 - len(ids))}  # sequential ids too

    counts = Counter(layout.shard_of(i) for i in ids)

    assert len(ids) == 10_000
    assert set(counts) == set(layout.all_shards())
    assert layout.all_shards() == [f"shard-{n:02d}" for n in range(16)]
    expected = 10_000 / layout.SHARDS
    assert all(0.8 * expected <= c <= 1.2 * expected for c in counts.values()), counts


#: What the status row of a sample order carries besides its key.
STATUS_PROPS = {"OrderRef": "o-1", "Workflow": "order"}
FULFILMENT_PROPS = {"OrderRef": "o-1", "Workflow": "fulfilment"}


def test_row_keys() -> None:
    due = datetime(2026, 11, 22, 10, 0, 30, 500000, tzinfo=UTC)

    assert layout.order_row("o-1") == "order|o-1|order"
    assert layout.step_row("o-1", 2, "ship") == "order|o-1|step|002|ship"
    assert layout.pending_row(due, "o-1", "ship") == "pending|20261122T100030.500000Z|o-1|ship"
    assert layout.processing_row(due, "o-1", "ship") == (
        "processing|20261122T100030.500000Z|o-1|ship"
    )
    # newest first: 10**13 - 1 minus the milliseconds since 1970
    millis = int(due.timestamp() * 1000)
    assert layout.status_row("error", "o-1", due) == f"status|error|{10**13 - 1 - millis}|o-1"
    assert layout.outbox_row(due, "o-1", "3") == "outbox|20261122T100030.500000Z|o-1|3"


def test_an_orders_rows_share_a_prefix_no_other_order_has() -> None:
    prefix = layout.order_prefix("o-1")

    assert layout.order_row("o-1").startswith(prefix)
    assert layout.step_row("o-1", 0, "process").startswith(prefix)
    assert not layout.order_row("o-10").startswith(prefix)
    assert not layout.step_row("o-1-b", 0, "process").startswith(prefix)


def test_high_sorts_after_every_key_character() -> None:
    key_chars = string.ascii_letters + string.digits + "-_|.:"

    assert all(c < layout.HIGH for c in key_chars)


def test_processing_rows_sort_by_deadline_whatever_the_order_id() -> None:
    early = layout.processing_row(T0 + timedelta(seconds=1), "zzz", "process")
    late = layout.processing_row(T0 + timedelta(seconds=2), "aaa", "process")
    cutoff = f"processing|{sortable(T0 + timedelta(seconds=1.5))}"  # a sweep's range end

    assert early < cutoff < late


# --- layout: index rows of an order --------------------------------------------------------

POLICY = RetryPolicy(max_failure_count=3, soft_threshold=1, base_backoff_seconds=2)


def accept(workflow: str = "order", order_id: str = "o-1") -> Order:
    message = decode_order(json.dumps({"orderId": order_id, "workflow": workflow}))
    return Order.accept(message, Plan.of(WORKFLOWS[workflow], 30), T0)


def reply(order: Order, outcome: Outcome, now: datetime) -> None:
    step = order.active_step()
    assert step is not None
    order.apply_reply(
        AgentReply(
            order.order_id,
            step.step,
            step.attempt,
            step.complete_by,
            outcome,
            result={"ok": True} if outcome == Outcome.SUCCEEDED else None,
            error="declined" if outcome == Outcome.REFUSED else None,
            token=step.token_for(step.attempt),
        ),
        now,
    )


def test_new_order_is_pending_and_due_now() -> None:
    order = accept()

    assert layout.index_rows(order) == {
        layout.status_row("pending", "o-1", T0): STATUS_PROPS,
        "pending|20261122T100000.000000Z|o-1|process": {
            "OrderRef": "o-1",
            "StepName": "process",
            "Agent": "orders",
        },
    }


def test_claimed_order_is_indexed_by_its_deadline() -> None:
    order = accept()
    order.claim("instance-a", T0 + timedelta(seconds=1))

    assert layout.index_rows(order) == {
        layout.status_row("processing", "o-1", T0): STATUS_PROPS,
        "processing|20261122T100031.000000Z|o-1|process": {
            "OrderRef": "o-1",
            "StepName": "process",
            "Agent": "orders",
            # the stuck check counts a Processing step's age from its claim
            "Since": "20261122T100001.000000Z",
        },
    }


def test_completed_order_leaves_the_sweep_ranges() -> None:
    order = accept()
    order.claim("instance-a", T0)
    reply(order, Outcome.SUCCEEDED, T0 + timedelta(seconds=5))

    assert layout.index_rows(order) == {layout.status_row("completed", "o-1", T0): STATUS_PROPS}


def test_expired_step_is_pending_again_at_its_backoff_time() -> None:
    order = accept()
    order.claim("instance-a", T0)
    now = T0 + timedelta(seconds=31)
    order.expire(now, POLICY)  # first failure: within the soft threshold, due at once

    assert layout.index_rows(order) == {
        layout.status_row("processing", "o-1", T0): STATUS_PROPS,
        "pending|20261122T100031.000000Z|o-1|process": {
            "OrderRef": "o-1",
            "StepName": "process",
            "Agent": "orders",
        },
    }

    order.claim("instance-b", now)
    later = now + timedelta(seconds=31)
    order.expire(later, POLICY)  # second failure: backoff
    due = later + POLICY.backoff(2, "o-1")

    assert due > later
    assert layout.index_rows(order) == {
        layout.status_row("processing", "o-1", T0): STATUS_PROPS,
        layout.pending_row(due, "o-1", "process"): {
            "OrderRef": "o-1",
            "StepName": "process",
            "Agent": "orders",
        },
    }


def test_order_in_error_has_only_its_status_row() -> None:
    order = accept()
    now = T0
    for _ in range(POLICY.max_failure_count):
        now = max(now, order.steps[0].complete_by)  # wait out the backoff
        order.claim("instance-a", now)
        now += timedelta(seconds=31)
        order.expire(now, POLICY)

    assert layout.index_rows(order) == {layout.status_row("error", "o-1", T0): STATUS_PROPS}


def test_next_step_of_a_workflow_is_pending_and_a_compensation_is_indexed_like_a_step() -> None:
    order = accept("fulfilment")
    order.claim("instance-a", T0)
    reply(order, Outcome.SUCCEEDED, T0 + timedelta(seconds=1))

    assert layout.index_rows(order) == {
        layout.status_row("processing", "o-1", T0): FULFILMENT_PROPS,
        "pending|20261122T100001.000000Z|o-1|charge-payment": {
            "OrderRef": "o-1",
            "StepName": "charge-payment",
            "Agent": "payments",
        },
    }

    order.claim("instance-a", T0 + timedelta(seconds=2))
    reply(order, Outcome.REFUSED, T0 + timedelta(seconds=3))

    assert layout.index_rows(order) == {
        layout.status_row("compensating", "o-1", T0): FULFILMENT_PROPS,
        "pending|20261122T100003.000000Z|o-1|release-stock": {
            "OrderRef": "o-1",
            "StepName": "release-stock",
            "Agent": "inventory",
        },
    }
