"""The README and docs/ stay true where a test can check it cheaply: the README's table of
functions against what ``function_app.py`` registers, its settings table against
``config/settings.py``, the size of the bad-input catalogue docs/messages-and-state.md
quotes against the catalogue itself, and every relative link between the pages."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from config import settings
from core.names import Names
from core.workflows import AGENTS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MESSAGES = (ROOT / "docs" / "messages-and-state.md").read_text(encoding="utf-8")


def _table_after(header: str) -> list[str]:
    start = README.index(header)
    rows = []
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _expand(name: str) -> set[str]:
    """A name as the README writes it, with ``<agent>`` or ``<queue>`` spelled out."""
    names = Names()
    if "<agent>" in name:
        # an agent's function name is its name with "-" as "_" (core/agent_spec.py)
        return {name.replace("<agent>", a.replace("-", "_")) for a in AGENTS}
    if name == "alert_<queue>_poison":
        return {f"alert_{q.replace('-', '_')}" for q in names.poison_queues()}
    if name == "alert_<queue>_dead_letters":
        return {
            f"alert_{q.replace('-', '_')}_dead_letters"
            for q in (*names.agent_queues(), names.agent_replies, names.order_wakeups)
        }
    return {name}


#: function_app's functions as deployed (the agent queues on Service Bus: the dead-letter
#: triggers too), in a process of its own: the transport is read when the app is indexed.
_REGISTERED = (
    "import json, function_app; "
    "print(json.dumps([f.get_function_name() for f in function_app.app.get_functions()]))"
)


def test_the_function_table_is_what_the_app_registers() -> None:
    env = {**os.environ, "AGENT_TRANSPORT": "servicebus"}
    listing = subprocess.run(
        [sys.executable, "-c", _REGISTERED],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert listing.returncode == 0, listing.stderr[-2000:]
    registered = set(json.loads(listing.stdout.strip().splitlines()[-1]))
    listed: set[str] = set()
    for row in _table_after("| role | functions (trigger) | code |"):
        functions = row.split("|")[2]
        # function names: identifiers in backticks that are not a queue or a setting
        for name in re.findall(r"`([a-z][a-z_<>]*)`", functions):
            if "_" in name or name == "supervise":
                listed |= _expand(name)
    assert listed == registered, {
        "listed, not registered": sorted(listed - registered),
        "registered, not listed": sorted(registered - listed),
    }


def test_the_settings_table_names_every_setting_the_code_reads() -> None:
    table = _table_after("| setting | default | meaning |")
    named = {m for row in table for m in re.findall(r"^\| `([A-Za-z_.<>]+)`", row)}
    expected = set(settings.APP_SETTINGS) | {
        settings.DECLARATIONS,
        settings.APPINSIGHTS_CONNECTION,
        settings.APPINSIGHTS_AUTHENTICATION,
        "AGENT_<NAME>_URL",
        "AGENT_<NAME>_API_KEY",
    }
    assert named == expected, {
        "in the README only": sorted(named - expected),
        "missing from the README": sorted(expected - named),
    }


def test_the_bad_input_counts_are_the_catalogues() -> None:
    from tests.integration import test_bad_input

    match = re.search(r"(\d+) kinds of bad order and (\d+) kinds of bad transport", MESSAGES)
    assert match is not None
    transport = next(
        m
        for m in test_bad_input.test_bad_transport_messages_are_quarantined_with_a_reason.pytestmark  # type: ignore[attr-defined]
        if m.name == "parametrize"
    )
    assert (int(match[1]), int(match[2])) == (
        len(test_bad_input.ORDER_CATALOGUE),
        len(transport.args[1]),
    )


# --- links: every relative link in README.md and docs/*.md resolves ------------------------

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~)")
#: [text](target) and ![alt](target); a target may carry a "title"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> str:
    """``text`` with fenced code blocks and inline code spans blanked out, lines kept (a
    link's text may run over two lines)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading)  # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link into ``page`` may name: its headings' slugs (with GitHub's
    ``-1``, ``-2`` for repeats) and its ``<a id=...>`` elements."""
    text = page.read_text(encoding="utf-8")
    found: set[str] = set(ANCHOR.findall(text))
    seen: dict[str, int] = {}
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match[2])
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(pages: list[Path], root: Path = ROOT) -> list[str]:
    """``page:line: target (why)`` for each relative link that does not resolve."""
    broken = []
    for page in pages:
        prose = _prose(page.read_text(encoding="utf-8"))
        for match in LINK.finditer(prose):
            target, number = match[1], prose.count("\n", 0, match.start(1)) + 1
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto: ...
            path, _, anchor = target.partition("#")
            goal = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}:{number}: {target}"
            if not goal.exists():
                broken.append(f"{where} (no file {path})")
            elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
                broken.append(f"{where} (no heading or <a id> {anchor!r} in {goal.name})")
    return broken


def test_every_relative_link_resolves() -> None:
    broken = broken_links(PAGES)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    """The check above can fail: a missing file, a missing anchor, and a heading's slug."""
    (tmp_path / "b.md").write_text('# Operator\'s guide: `the` console\n<a id="x-1"></a>\n')
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#operators-guide-the-console) [ok](b.md#x-1) [ok](#here)\n"
        "## Here\n[gone](c.md) [no anchor](b.md#nowhere) [over two\nlines](f.md)\n"
        "```\n[in code](d.md)\n```\n`[in a span](e.md)`\n"
    )
    broken = broken_links([page], root=tmp_path)
    assert [b.split(" (", 1)[0] for b in broken] == [
        "a.md:3: c.md",
        "a.md:3: b.md#nowhere",
        "a.md:4: f.md",
    ]


def test_no_page_names_a_tracker_issue() -> None:
    """Say what changed, not which ticket asked for it."""
    named = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in PAGES
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"issue ?#?[0-9]+", line, re.IGNORECASE)
    ]
    assert not named, named


#: A path as the pages name it in backticks: a file with an extension, or a folder (``/``).
_PATH = re.compile(
    r"`([A-Za-z0-9_.\-/]+(?:\.(?:py|md|json|bicep|bicepparam|yaml|yml|toml|txt|html|js|css|sh|png)|/))`"
)
#: Named by the pages and written only when something runs (not in a clean clone).
_WRITTEN_WHEN_RUN = {"bench/results/"}
#: Installed by ``make deps``, not part of the tree.
_INSTALLED = {"node_modules"}


def test_every_path_the_pages_name_exists() -> None:
    """The README and docs/ name files and folders of this tree (``core/model.py``,
    ``infra/main.bicep``): each exists, so that a reader who follows one finds it. A name
    whose first part is no top-level entry (a remote's path, ``/health``) is not a path
    of the tree."""
    tops = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
    missing: list[str] = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for named in sorted(set(_PATH.findall(page.read_text(encoding="utf-8")))):
            if named in _WRITTEN_WHEN_RUN:
                continue
            if "/" not in named or named.split("/")[0] not in tops - _INSTALLED:
                continue  # a bare file name is named beside its folder
            if not ((ROOT / named).exists() or (ROOT / "docs" / named).exists()):
                missing.append(f"{page.relative_to(ROOT)}: {named}")
    assert missing == [], missing


def test_the_readmes_map_of_folders_names_files_that_exist() -> None:
    """The README's map of the folders ("The folders are the architecture") names each
    folder and, in its description, the modules that do each thing: every one exists."""
    block = README.split("The folders are the architecture:", 1)[1].split("```")[1]
    folder = ""
    missing: list[str] = []
    for line in block.splitlines():
        head = re.match(r"([a-z_]+)/\s", line)
        if head:
            folder = head[1]
            if not (ROOT / folder).is_dir():
                missing.append(f"{folder}/")
        for named in re.findall(r"[A-Za-z0-9_./]+\.py\b", line):
            where = ROOT / named if "/" in named else ROOT / folder / named
            if not where.exists():
                missing.append(str(where.relative_to(ROOT)))
    assert folder, "no map found"
    assert missing == [], missing
