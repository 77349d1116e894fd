"""Pins the premise of the node checks' clock comparison (polarstack.checks.nodes, issue 28 point 6): an engine served
the way sglang serves it (uvicorn, here the emulator) sends an HTTP Date header, within the bound of this machine's
clock, so the check reads each node's clock from its engine."""

import email.utils
import time

import httpx
import pytest

from polarstack.checks import nodes

pytestmark = pytest.mark.emulator


def test_the_emulator_sends_the_date_header_the_clock_check_reads(engine):
    response = httpx.get(f"{engine.url}/health", timeout=10)
    theirs = email.utils.parsedate_to_datetime(response.headers["date"]).timestamp()
    assert abs(theirs - time.time()) < nodes.CLOCK_BOUND_SECONDS
