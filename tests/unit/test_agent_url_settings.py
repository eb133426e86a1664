"""An agent URL setting that names no declared agent is refused when the app starts
(``agents/url_settings.py``): ``AGENT_<NAME>_URL`` and azd's ``AGENT_URLS``, at the
bootstrap and in ``python -m admin deploy-check`` (which the azd hooks run), naming the
setting, the closest declared agent and all of them. On the suite's declarations
(``tests/fixtures/shop.py``: orders, inventory, payments, carrier)."""

from __future__ import annotations

import json

import pytest

from admin import __main__ as cli
from agents.url_settings import check_agent_urls
from bootstrap import bootstrap
from config.settings import SettingsError
from tests.support import settings_from

BASE = {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "AGENT_TRANSPORT": "storage"}
DECLARED = ("orders", "inventory", "payments", "carrier")


def start(**env: str) -> None:
    bootstrap(settings_from({**BASE, **env}))


def test_an_agent_url_setting_naming_no_agent_is_refused_at_start() -> None:
    with pytest.raises(SettingsError) as refused:
        start(AGENT_CARIER_URL="https://carrier.example.com")
    text = str(refused.value)
    assert text.startswith("AGENT_CARIER_URL names agent 'carier', which is not declared")
    assert "did you mean AGENT_CARRIER_URL?" in text
    assert "the declared agents: carrier, inventory, orders, payments" in text
    assert "REMOTE_SERVICE_URL" in text


def test_an_agent_urls_entry_naming_no_agent_is_refused_at_start() -> None:
    urls = {"carrier": "https://c.example.com", "paymnts": "https://p.example.com"}
    with pytest.raises(SettingsError) as refused:
        start(AGENT_URLS=json.dumps(urls))
    text = str(refused.value)
    assert "AGENT_URLS names agent 'paymnts', which is not declared" in text
    assert "did you mean 'payments'? the declared agents: payments, carrier, inventory" in text
    with pytest.raises(SettingsError, match="AGENT_URLS must be a JSON object"):
        start(AGENT_URLS='["carrier"]')
    with pytest.raises(SettingsError, match="AGENT_URLS must be a JSON object"):
        start(AGENT_URLS="carrier=https://c.example.com")


def test_no_close_match_lists_the_declared_agents_only() -> None:
    with pytest.raises(SettingsError) as refused:
        check_agent_urls({"AGENT_WAREHOUSE_URL": "https://w"}, DECLARED)
    text = str(refused.value)
    assert "did you mean" not in text
    assert "the declared agents: carrier, inventory, orders, payments" in text


def test_settings_that_name_declared_agents_start() -> None:
    start(
        AGENT_CARRIER_URL="https://carrier.example.com",
        AGENT_URLS=json.dumps({"payments": "https://p.example.com"}),
        AGENT_URLS_NOTE="",  # not an agent's URL setting: AGENT_<NAME>_URL only
        AGENT_CARRIER_API_KEY="k",
    )
    check_agent_urls({"AGENT_URLS": " ", "AGENT_TRANSPORT": "storage"}, DECLARED)
    check_agent_urls({"AGENT_SHOP_ORDERS_URL": "https://o"}, ("shop-orders",))


def test_deploy_check_refuses_an_agent_urls_entry_naming_no_agent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the azd hooks run, with the environment's AGENT_URLS: refused (exit 2) before
    anything is read."""
    monkeypatch.setenv("AGENT_URLS", json.dumps({"carier": "https://c.example.com"}))
    code = cli.main(["--connection", "UseDevelopmentStorage=true", "deploy-check"])
    assert code == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert "AGENT_URLS names agent 'carier'" in error and "did you mean 'carrier'?" in error
