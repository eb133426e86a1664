"""A workaround for azure-core's table transactions: no thread pool per transaction.

azure-core 1.41.0 runs the per-operation policies of a multipart (batch)
request, and of its response, through a fresh ``ThreadPoolExecutor`` each
time (``Pipeline._prepare_multipart_mixed_request`` and ``_parts_helper``):
every table transaction starts and joins two or three pools of threads. The
benchmark's profile showed that as about half of a scheduler's CPU. These
replacements do the same work in a loop, in the calling thread (the policies
are CPU-only header and serialization steps: nothing is gained by threads).

Applied only to the pinned azure-core version; with any other version it
does nothing and says so, so an upgrade can never run a stale copy.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import azure.core
from azure.core.pipeline import PipelineContext, PipelineRequest, PipelineResponse
from azure.core.pipeline import _base as pipeline_base
from azure.core.pipeline._tools import await_result
from azure.core.pipeline.transport import _base as transport_base
from azure.core.rest import _http_response_impl as rest_response
from azure.core.utils import _pipeline_transport_rest_shared as shared

log = logging.getLogger(__name__)

PATCHED_VERSION = "1.41.0"
_applied = False


def _prepare_multipart_mixed_request(request: Any) -> None:
    info = request.multipart_mixed_info
    if not info:
        return
    requests, policies, options = info[0], info[1], info[3]
    for sub in requests:
        if sub.multipart_mixed_info:
            _prepare_multipart_mixed_request(sub)
        pipeline_request = PipelineRequest(sub, PipelineContext(None, **options))
        for policy in policies:
            await_result(policy.on_request, pipeline_request)


def _parts_helper(response: Any) -> Iterator[Any]:
    if not response.content_type or not response.content_type.startswith("multipart/mixed"):
        raise ValueError("You can't get parts if the response is not multipart/mixed")
    responses = response._get_raw_parts()
    if response.request.multipart_mixed_info:
        policies = response.request.multipart_mixed_info[1]
        for part in responses:
            http_request = part.request
            context = PipelineContext(None)
            pipeline_request = PipelineRequest(http_request, context)
            pipeline_response = PipelineResponse(http_request, part, context=context)
            for policy in policies:
                await_result(policy.on_response, pipeline_request, pipeline_response)
    return responses  # type: ignore[no-any-return]


def apply() -> bool:
    """Install the sequential versions (once); False if the azure-core version differs."""
    global _applied  # noqa: PLW0603
    if _applied:
        return True
    if azure.core.__version__ != PATCHED_VERSION:
        log.warning(
            "azure-core %s is not %s: table transactions keep azure-core's thread "
            "pools (see stores/sdk_patches.py)",
            azure.core.__version__,
            PATCHED_VERSION,
        )
        return False
    pipeline_base.Pipeline._prepare_multipart_mixed_request = staticmethod(  # type: ignore[method-assign]
        _prepare_multipart_mixed_request
    )
    shared._parts_helper = _parts_helper
    rest_response._parts_helper = _parts_helper  # type: ignore[attr-defined]
    transport_base._parts_helper = _parts_helper  # type: ignore[attr-defined]
    _applied = True
    return True
