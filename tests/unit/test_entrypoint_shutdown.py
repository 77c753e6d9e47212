"""The components' loop handler: kopf's own watch stream, closed by asyncio at shutdown, is not reported as
an error (CI once saw its traceback in a stopped operator's output); every other loop error still is."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from kopf._cogs.clients import watching

from podsnap.kube.entrypoint import quiet_kopf_watch_close

CLOSE_ERROR = "an error occurred during closing of asynchronous generator"


def _report(agen: object) -> None:
    loop = asyncio.new_event_loop()
    try:
        quiet_kopf_watch_close(
            loop,
            {
                "message": CLOSE_ERROR,
                "asyncgen": agen,
                "exception": RuntimeError("generator didn't stop after athrow()"),
            },
        )
    finally:
        loop.close()


def test_kopfs_watch_stream_closed_at_shutdown_is_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    # kopf's real watch generator, never started: the handler must recognise the very object asyncio passes
    agen = watching.infinite_watch(settings=None, resource=None, namespace=None)  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)
    _report(agen)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "kopf's watch stream closed at shutdown" in caplog.text


def test_any_other_generator_error_is_still_reported(caplog: pytest.LogCaptureFixture) -> None:
    async def infinite_watch() -> AsyncIterator[int]:  # same name, not kopf's
        yield 1

    caplog.set_level(logging.DEBUG)
    _report(infinite_watch())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and CLOSE_ERROR in errors[0].getMessage(), caplog.text
