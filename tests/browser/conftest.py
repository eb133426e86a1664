"""Fixtures of the browser layer (the harness itself is in harness.py).

- ``console`` (session): the app (Azurite, the simulator, devhost 0 with the writable
  console, devhost 1 read-only and HTTP only) on the tests' declarations
  (``tests/fixtures/flows.py``), with its orders settled; ~20 s to start.
- ``driver`` (session): one headless Chromium for every test.
- ``browser`` (per test): that Chromium with bounded waits. When a test fails, its
  screenshot, page source and browser log are saved under the test's pytest tmp dir,
  and the report names them (section "browser artifacts") with the devhosts' log tails.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.harness import Browser, Console, chromium, running_console


@pytest.fixture(scope="session")
def console() -> Iterator[Console]:
    with running_console() as app:
        yield app


@pytest.fixture(scope="session")
def driver() -> Iterator[WebDriver]:
    chrome = chromium()
    try:
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture
def browser(driver: WebDriver, tmp_path: Path) -> Browser:
    return Browser(driver, tmp_path / "browser")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """On a failed test, save what the browser showed and name the files in the report."""
    report = yield
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        browser = funcargs.get("browser")
        if isinstance(browser, Browser):
            saved = browser.save_artifacts()
            report.sections.append(("browser artifacts", "\n".join(map(str, saved))))
        app = funcargs.get("console")
        if isinstance(app, Console):
            report.sections.append(("devhost logs (tail)", app.log_tail()))
    return report
