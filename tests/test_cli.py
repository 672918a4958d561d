"""`kiln topics ...` against a running broker: success paths and clean failures
(non-zero exit, a message on stderr, no hang)."""

from __future__ import annotations

import time

from kiln_testlib import free_port, kiln


def test_topics_create_list_describe_delete(broker):
    b = ["--bootstrap", broker.addr]
    kiln("topics", "create", "cli-a", "--partitions", "3", "--replication-factor", "1",
         "--config", "retention.ms=3600000", *b)
    assert "cli-a" in kiln("topics", "list", *b).stdout
    desc = kiln("topics", "describe", "cli-a", *b).stdout
    assert "cli-a" in desc, desc
    kiln("topics", "delete", "cli-a", *b)
    assert "cli-a" not in kiln("topics", "list", *b).stdout


def expect_error(*args, stderr_has: str = "") -> str:
    cp = kiln(*args, check=False)
    assert cp.returncode != 0, f"`kiln {' '.join(args)}` succeeded: {cp.stdout}"
    assert cp.stderr.strip(), "failure without a message on stderr"
    assert stderr_has.lower() in cp.stderr.lower(), cp.stderr
    return cp.stderr


def test_topics_errors(broker):
    b = ["--bootstrap", broker.addr]
    kiln("topics", "create", "cli-b", "--partitions", "1", *b)
    expect_error("topics", "create", "cli-b", "--partitions", "1", *b, stderr_has="exist")
    expect_error("topics", "create", "cli-zero", "--partitions", "0", *b)
    expect_error("topics", "create", "cli-cfg", "--partitions", "1", "--config", "no.such.key=1", *b)
    expect_error("topics", "describe", "cli-missing", *b)
    expect_error("topics", "delete", "cli-missing", *b)
    assert "cli-zero" not in kiln("topics", "list", *b).stdout
    assert "cli-cfg" not in kiln("topics", "list", *b).stdout


def test_unreachable_broker_fails_fast():
    t0 = time.monotonic()
    expect_error("topics", "list", "--bootstrap", f"127.0.0.1:{free_port()}", "--timeout-s", "3")
    assert time.monotonic() - t0 < 20
