"""Retention rules (the ``RETENTION`` setting, ``admin purge``'s options) and the archive's
row format: what is due when, and rows that come back with the types they had."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import EdmType, EntityProperty

from config.settings import SettingsError
from core.retention import DEFAULT_RETENTION, Retention, archive_path, parse_duration
from core.states import OrderStatus
from stores import layout
from stores.archive import decode_lines, encode_lines, row_from_json, row_to_json
from tests.support import settings_from

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.mark.parametrize(
    ("text", "seconds"), [("0s", 0), ("15m", 900), ("12h", 43200), ("30d", 2592000)]
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "30", "d", "1.5d", "-1d", "30 days", "1w"])
def test_a_bad_duration_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="whole number and one unit"):
        parse_duration(text)


def test_the_default_keeps_completed_30_days_the_rest_90_and_error_180() -> None:
    rules = Retention.parse(DEFAULT_RETENTION)
    assert rules.keep_for("order", OrderStatus.COMPLETED) == 30 * DAY
    assert rules.keep_for("order", OrderStatus.COMPENSATED) == 90 * DAY
    assert rules.keep_for("order", OrderStatus.CANCELLED) == 90 * DAY
    # error orders wait for an operator, but not for ever: 180 days after their last change
    assert rules.keep_for("order", OrderStatus.ERROR) == 180 * DAY
    env = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"}
    assert settings_from(env).retention == rules


def test_an_operator_changes_the_error_default_or_keeps_error_orders_for_ever() -> None:
    longer = Retention.parse("completed=30d,error=365d,fulfilment/error=30d")
    assert longer.keep_for("order", OrderStatus.ERROR) == 365 * DAY
    assert longer.keep_for("fulfilment", OrderStatus.ERROR) == 30 * DAY
    for_ever = Retention.parse("completed=30d,compensated=90d,cancelled=90d")
    assert for_ever.keep_for("order", OrderStatus.ERROR) is None
    assert OrderStatus.ERROR not in for_ever.statuses()


def test_a_workflow_rule_wins_over_the_general_one_whatever_the_order() -> None:
    rules = Retention.parse("fulfilment/completed=7d,completed=30d")
    assert rules.keep_for("fulfilment", OrderStatus.COMPLETED) == 7 * DAY
    assert rules.keep_for("order", OrderStatus.COMPLETED) == 30 * DAY
    assert rules.widest(OrderStatus.COMPLETED) == 7 * DAY
    only = Retention.parse("fulfilment/completed=7d")
    assert only.keep_for("order", OrderStatus.COMPLETED) is None


def test_due_counts_from_when_the_order_finished() -> None:
    rules = Retention.parse("completed=30d")
    assert rules.due("order", OrderStatus.COMPLETED, NOW - 30 * DAY, NOW)
    assert not rules.due("order", OrderStatus.COMPLETED, NOW - 30 * DAY + timedelta(1), NOW)
    assert not rules.due("order", OrderStatus.CANCELLED, NOW - 300 * DAY, NOW)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("processing=1d", "cannot be archived"),
        ("pending=1d", "cannot be archived"),
        ("completed", "status=duration"),
        ("completed=1y", "whole number"),
        ("bad name/completed=1d", "not a workflow name"),
        ("completed=1d,completed=2d", "repeats"),
    ],
)
def test_bad_rules_name_the_setting_and_the_item(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as caught:
        Retention.parse(text)
    assert str(caught.value).startswith("RETENTION: ")


def test_settings_read_retention_and_fail_fast_on_a_bad_one() -> None:
    env = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"}
    settings = settings_from(env)
    assert str(settings.retention) == DEFAULT_RETENTION
    assert settings.retention_schedule == "0 */15 * * * *" and settings.retention_batch == 1000
    custom = settings_from({**env, "RETENTION": "error=365d", "RETENTION_BATCH": "50"})
    assert custom.retention.statuses() == [OrderStatus.ERROR] and custom.retention_batch == 50
    with pytest.raises(SettingsError, match="RETENTION: 'completed=soon'"):
        settings_from({**env, "RETENTION": "completed=soon"})
    with pytest.raises(SettingsError, match="RETENTION_SCHEDULE"):
        settings_from({**env, "RETENTION_SCHEDULE": "every day"})


def test_narrowed_keeps_only_rules_that_can_apply_and_only_to_that_workflow() -> None:
    rules = Retention.parse("completed=30d,fulfilment/completed=7d,cancelled=90d")
    assert str(rules.narrowed(OrderStatus.COMPLETED, "order")) == "order/completed=30d"
    assert str(rules.narrowed(None, "fulfilment")) == (
        "fulfilment/completed=7d,fulfilment/cancelled=90d"
    )
    assert str(rules.narrowed(OrderStatus.CANCELLED, None)) == "cancelled=90d"
    assert rules.narrowed(OrderStatus.ERROR, None).rules == ()
    narrowed = rules.narrowed(None, "fulfilment")
    assert narrowed.keep_for("order", OrderStatus.COMPLETED) is None  # other workflows stay


def test_older_than_never_names_error_unless_asked() -> None:
    assert str(Retention.older_than(DAY, None, None)) == (
        "completed=1d,compensated=1d,cancelled=1d"
    )
    assert str(Retention.older_than(DAY, OrderStatus.ERROR, "order")) == "order/error=1d"


def test_archive_paths_are_by_workflow_and_day() -> None:
    assert archive_path("order", NOW, "20261124T120000Z-abc123", 2) == (
        "order/2026/11/24/20261124T120000Z-abc123-002.jsonl.gz"
    )


def test_the_creation_time_is_read_back_from_a_status_row_key() -> None:
    created = datetime(2026, 9, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert layout.created_of_status_row(layout.status_row("completed", "o-1", created)) == created
    assert layout.created_of_status_row("status|completed|garbage") is None


def test_rows_round_trip_with_their_types() -> None:
    row = {
        "PartitionKey": "shard-01",
        "RowKey": "order|o|order",
        "Text": "héllo",
        "Flag": True,
        "Small": 7,
        "Big": 2**40,
        "Wide": EntityProperty(5, EdmType.INT64),
        "Ratio": 0.25,
        "When": datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        "Blob": b"\x00\xff",
        "Id": uuid.UUID(int=5),
        "Timestamp": datetime(2026, 1, 1, tzinfo=UTC),
    }
    back = row_from_json(row_to_json(row))
    assert "Timestamp" not in back  # the service's own; never written back
    assert back["Text"] == "héllo" and back["Flag"] is True and back["Small"] == 7
    assert back["Big"] == EntityProperty(2**40, EdmType.INT64)
    assert back["Wide"] == EntityProperty(5, EdmType.INT64)
    assert back["Ratio"] == 0.25 and back["When"] == row["When"]
    assert back["Blob"] == b"\x00\xff" and back["Id"] == uuid.UUID(int=5)
    lines = [{"orderId": "o", "rows": [row_to_json(row)]}]
    assert list(decode_lines(encode_lines(lines))) == lines


def test_the_cli_takes_error_orders_only_when_its_status_names_them() -> None:
    """The timer follows the settings (error=180d by default); ``admin purge`` archives
    error orders only with ``--status error`` (docs/contracts.md §3.12)."""
    rules = Retention.parse(DEFAULT_RETENTION)
    assert OrderStatus.ERROR not in rules.cli_run(None, None, None).statuses()
    assert OrderStatus.ERROR not in rules.cli_run(None, "order", None).statuses()
    assert OrderStatus.ERROR not in rules.cli_run(None, None, DAY).statuses()
    named = rules.cli_run(OrderStatus.ERROR, None, None)
    assert named.statuses() == [OrderStatus.ERROR] and named.widest(OrderStatus.ERROR) == 180 * DAY
    assert str(rules.cli_run(OrderStatus.ERROR, None, 7 * DAY)) == "error=7d"
