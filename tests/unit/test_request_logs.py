"""The app turns off the per-request INFO lines of the Azure SDKs and httpx when it is
wired, and keeps a level someone set on purpose."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from bootstrap import bootstrap
from observability import logs
from tests.support import settings_from


@pytest.fixture
def loggers() -> Iterator[list[logging.Logger]]:
    chosen = [logging.getLogger(name) for name in logs.REQUEST_LOGGERS]
    before = [logger.level for logger in chosen]
    for logger in chosen:
        logger.setLevel(logging.NOTSET)
    yield chosen
    for logger, level in zip(chosen, before, strict=True):
        logger.setLevel(level)


def test_wiring_the_app_quiets_the_request_loggers(loggers: list[logging.Logger]) -> None:
    assert logging.getLogger("httpx").level == logging.NOTSET
    bootstrap(
        settings_from(
            {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"}
        )
    )
    assert [logger.level for logger in loggers] == [logging.WARNING] * len(loggers)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)


def test_a_level_set_on_purpose_is_kept(loggers: list[logging.Logger]) -> None:
    loggers[0].setLevel(logging.DEBUG)
    logs.quiet_request_logs()
    assert loggers[0].level == logging.DEBUG
    assert loggers[1].level == logging.WARNING
