"""The azure-core workaround is active for the pinned version, and only for it."""

from __future__ import annotations

import azure.core
import pytest
from azure.core.pipeline import _base as pipeline_base

from stores import sdk_patches


def test_the_patch_is_applied_to_the_pinned_azure_core() -> None:
    # If this fails after an upgrade, re-check azure-core's multipart code and the patch.
    assert azure.core.__version__ == sdk_patches.PATCHED_VERSION
    assert sdk_patches.apply()
    assert pipeline_base.Pipeline._prepare_multipart_mixed_request is (
        sdk_patches._prepare_multipart_mixed_request
    )


def test_another_version_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdk_patches, "_applied", False)
    monkeypatch.setattr(azure.core, "__version__", "9.9.9")
    assert sdk_patches.apply() is False
