"""The Azure Monitor rules (infra/app/alerts.bicep) parse the records the app logs: the
prefix each rule filters on and the fields it parses are those of the code's own format
strings, in their order, so a reworded log line fails here, not silently in Azure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BICEP = (ROOT / "infra" / "app" / "alerts.bicep").read_text(encoding="utf-8")


def query(name: str) -> str:
    found = re.search(rf"var {name} = '''(.*?)'''", BICEP, re.S)
    assert found, f"no {name} in alerts.bicep"
    return found[1]


def formats(path: str) -> list[str]:
    """The string literals that start a log call's format in ``path``."""
    text = (ROOT / path).read_text(encoding="utf-8")
    return re.findall(r'log\.\w+\(\s*(?:f?)"([^"]+)"', text)


@pytest.mark.parametrize(
    ("rule", "path", "prefixes"),
    [
        ("outageAlertQuery", "messaging/outages.py", ("OUTAGE ALERT", "OUTAGE RECOVERED")),
    ],
)
def test_each_prefix_the_rule_filters_on_is_a_record_the_app_logs(
    rule: str, path: str, prefixes: tuple[str, ...]
) -> None:
    kql = query(rule)
    logged = formats(path)
    for prefix in prefixes:
        assert f'startswith_cs "{prefix}"' in kql, (rule, prefix)
        [fmt] = [f for f in logged if f.startswith(prefix)]
        # the rule parses " agent=" then " since=": the record has them, in that order
        tokens = re.findall(r'"( \w+=)"', kql.split("| parse", 1)[1])
        positions = [fmt.find(token) for token in tokens]
        assert all(p > 0 for p in positions) and positions == sorted(positions), (fmt, tokens)
