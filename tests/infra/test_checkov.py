"""(b) checkov finds nothing to fix, and every skip is justified and documented.

A skip is a `// checkov:skip=ID: reason` line inside the resource's braces,
one id per line. The same (id, file, reason) must appear in the skip table of
docs/deployment.md, so a reviewer reads every exception in one place.
"""

from __future__ import annotations

from typing import Any

from tests.infra.bicep import INFRA, Skip, bicep_skips, documented_skips, rel

MIN_REASON_WORDS = 8


def _describe(check: dict[str, Any]) -> str:
    return (
        f"{check['check_id']} {check.get('check_name', '')}\n"
        f"    in infra{check.get('file_path', '')} ({check.get('resource', '')}), "
        f"lines {check.get('file_line_range')}"
    )


def test_checkov_parses_every_file(checkov_report: dict[str, Any]) -> None:
    summary = checkov_report["summary"]
    unparsed = checkov_report["results"].get("parsing_errors", [])
    assert summary.get("parsing_errors", 0) == 0 and not unparsed, (
        f"checkov could not parse {unparsed or summary['parsing_errors']} (and would have exited 0)"
    )
    assert summary.get("resource_count", 0) > 0, f"checkov scanned no resource: {summary}"
    assert summary.get("passed", 0) > 0, f"checkov ran no check: {summary}"


def test_checkov_reports_no_failed_check(checkov_report: dict[str, Any]) -> None:
    failed = checkov_report["results"].get("failed_checks", [])
    assert not failed, (
        f"{len(failed)} failed checkov check(s); fix them, or skip with a reason "
        "(see docs/deployment.md):\n" + "\n".join(_describe(check) for check in failed)
    )


def test_skip_comments_are_well_formed() -> None:
    skips, malformed = bicep_skips()
    assert not malformed, (
        "skip comments must read `// checkov:skip=ID: reason`, one id per line:\n"
        + "\n".join(malformed)
    )
    short = [skip for skip in skips if len(skip.reason.split()) < MIN_REASON_WORDS]
    assert not short, f"give each skip a reason a reviewer can accept: {short}"
    ids = [(skip.file, skip.check_id) for skip in skips]
    assert len(ids) == len(set(ids)), f"duplicate skips: {sorted(ids)}"


def test_every_skip_comment_is_applied_by_checkov(checkov_report: dict[str, Any]) -> None:
    """A skip outside a resource's braces is silently ignored by checkov."""
    skips, _ = bicep_skips()
    written = {(skip.file, skip.check_id) for skip in skips}
    applied = {
        (rel(INFRA / check["file_path"].lstrip("/")), check["check_id"])
        for check in checkov_report["results"].get("skipped_checks", [])
    }
    assert written == applied, (
        f"written but not applied (outside a resource?): {sorted(written - applied)}; "
        f"applied but not found in the text: {sorted(applied - written)}"
    )


def test_skips_match_the_documented_list() -> None:
    in_bicep = set(bicep_skips()[0])
    in_docs = set(documented_skips())
    assert in_docs, "docs/deployment.md has no checkov skip table"

    def show(skips: set[Skip]) -> str:
        return "\n".join(f"  | {s.check_id} | {s.file} | {s.reason} |" for s in sorted(skips))

    assert in_bicep == in_docs, (
        "docs/deployment.md and the Bicep skip comments disagree.\n"
        f"Only in Bicep:\n{show(in_bicep - in_docs)}\nOnly in the docs:\n{show(in_docs - in_bicep)}"
    )
