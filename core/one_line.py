"""A workflow's element in one line, for a person reading ``Workflow.describe()`` (``GET
/api/workflows``, ``python -m admin workflows``) beside its JSON."""

from __future__ import annotations

from typing import Any


def for_each_summary(shown: dict[str, Any]) -> str:
    """A ForEach as ``describe()`` shows it (``shown``), in one line: "reserve: for each of
    items(lines), at most 2 at once: reserve-line@warehouse, undone by unreserve"."""
    step = shown["step"]
    items = str(shown["items"]).rsplit(".", 1)[-1]
    text = (
        f"{shown['forEach']}: for each of items({items}), at most {shown['maxConcurrency']} "
        f"at once: {step['step']}@{step['agent']}"
    )
    if step["path"] != step["step"]:
        text += f" /{step['path']}"
    undo = step.get("compensation")
    if undo is not None:
        text += f", undone by {undo['step']}"
        if undo["agent"] != step["agent"]:
            text += f"@{undo['agent']}"
    if step.get("onFailure", "unwind") != "unwind":
        text += f", on failure: {step['onFailure']}"
    return text
