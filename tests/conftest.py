"""Shared fixtures for Kiln's real-client tests.

Every test gets its own broker (`broker` fixture): a `kiln broker` process on
a free loopback port with a fresh data directory, stopped at the end. The
broker's stderr goes to a file that is attached to the report of any failing
test (section "kiln broker log").
"""

from __future__ import annotations

import pytest

from kiln_testlib import Broker


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for b in getattr(item, "kiln_brokers", []):
            rep.sections.append((f"kiln broker log ({b.addr}, {b.starts} start(s))",
                                 b.log_tail()))


@pytest.fixture
def make_broker(request, tmp_path):
    """Factory: make_broker(**kw) starts another broker; all are stopped at the end."""
    brokers: list[Broker] = []
    request.node.kiln_brokers = brokers

    def make(start: bool = True, **kw) -> Broker:
        n = len(brokers)
        b = Broker(tmp_path / f"data{n}", tmp_path / f"broker{n}.log", **kw)
        brokers.append(b)
        if start:
            b.start()
        return b

    yield make
    died = []
    for b in brokers:
        if b.proc is not None and b.proc.poll() is not None and not b.killed_by_test:
            died.append(f"{b.addr} exited on its own with status {b.proc.returncode}")
        b.stop()
    if died:
        pytest.fail("kiln broker died during the test: " + "; ".join(died), pytrace=False)


@pytest.fixture
def broker(make_broker) -> Broker:
    """A running single-node broker with a fresh data dir; yields the Broker."""
    return make_broker()


