-- Dead-letter triage (kiln deadletter), PostgreSQL flavour. Keep in step with
-- migrations/sqlite/0002_triage.sql.

-- One row per dead-lettered node and cycle: what the dead-letter message said, the failing
-- checks of its last attempt and the suggested action. No foreign key to nodes: the record
-- stands on its own (the message carries the node's identity), and whether it is still open
-- is read from the node's current row when a report is built.
CREATE TABLE triage (
    hostname            TEXT    NOT NULL,
    cycle               BIGINT  NOT NULL CHECK (cycle >= 1),
    rack                TEXT    NOT NULL,
    bmc_address         TEXT    NOT NULL,
    attempts            BIGINT  NOT NULL CHECK (attempts >= 1),
    first_failure_at_ms BIGINT  NOT NULL,
    last_failure_at_ms  BIGINT  NOT NULL,
    dead_lettered_at_ms BIGINT  NOT NULL,
    action              TEXT    NOT NULL,
    last_error          TEXT    NOT NULL DEFAULT '',
    failing_checks      TEXT    NOT NULL DEFAULT '[]',
    recorded_at_ms      BIGINT  NOT NULL,
    -- Report day (YYYY-MM-DD, the report's time zone) of the first report that listed it.
    first_reported_day  TEXT,
    PRIMARY KEY (hostname, cycle)
);
CREATE INDEX triage_by_rack ON triage (rack, hostname);

-- One row per report day: claimed ('sending') before the email goes out, 'sent' after. The
-- primary key is the once-per-day rule; a claim left by a crash is never sent again.
CREATE TABLE triage_reports (
    day            TEXT    PRIMARY KEY,
    status         TEXT    NOT NULL CHECK (status IN ('sending', 'sent')),
    claimed_at_ms  BIGINT  NOT NULL,
    claimed_by     TEXT    NOT NULL,
    sent_at_ms     BIGINT,
    message_id     TEXT,
    nodes_new      BIGINT,
    nodes_open     BIGINT,
    CHECK ((status = 'sent') = (sent_at_ms IS NOT NULL))
);
