-- Kiln results store, SQLite flavour (the embedded default). Keep in step with
-- migrations/postgres/0001_results_store.sql: same tables, columns and constraints.
-- Times are Unix milliseconds (INTEGER); JSON is stored as TEXT.

CREATE TABLE racks (
    name          TEXT    PRIMARY KEY,
    created_at_ms INTEGER NOT NULL
);

-- One row per node: its identity (hostname), what the latest manifest said about it,
-- and where it is now. cycle counts registrations (1 = first); attempt counts within a cycle.
CREATE TABLE nodes (
    hostname           TEXT    PRIMARY KEY,
    rack               TEXT    NOT NULL REFERENCES racks (name),
    bmc_address        TEXT    NOT NULL,
    gpu_model          TEXT    NOT NULL,
    gpu_count          INTEGER NOT NULL CHECK (gpu_count BETWEEN 0 AND 16),
    firmware_bmc       TEXT    NOT NULL,
    firmware_bios      TEXT    NOT NULL,
    firmware_gpu_vbios TEXT    NOT NULL,
    firmware_nic       TEXT    NOT NULL,
    labels             TEXT    NOT NULL DEFAULT '{}',
    state              TEXT    NOT NULL
        CHECK (state IN ('queued', 'running', 'passed', 'retrying', 'dead_lettered')),
    state_reason       TEXT    NOT NULL DEFAULT '',
    cycle              INTEGER NOT NULL CHECK (cycle >= 1),
    attempt            INTEGER NOT NULL CHECK (attempt >= 1),
    registered_at_ms   INTEGER NOT NULL,
    updated_at_ms      INTEGER NOT NULL
);
CREATE INDEX nodes_by_rack_state ON nodes (rack, state);

-- Every state change, so the store can say why a node is where it is.
CREATE TABLE node_events (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    hostname TEXT    NOT NULL REFERENCES nodes (hostname),
    at_ms    INTEGER NOT NULL,
    cycle    INTEGER NOT NULL,
    attempt  INTEGER NOT NULL,
    state    TEXT    NOT NULL,
    reason   TEXT    NOT NULL
);
CREATE INDEX node_events_by_hostname ON node_events (hostname, id);

-- One burn-in run per (node, cycle, attempt): a redelivered message finds its run here.
CREATE TABLE runs (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    hostname       TEXT    NOT NULL REFERENCES nodes (hostname),
    cycle          INTEGER NOT NULL CHECK (cycle >= 1),
    attempt        INTEGER NOT NULL CHECK (attempt >= 1),
    agent          TEXT    NOT NULL,
    started_at_ms  INTEGER NOT NULL,
    finished_at_ms INTEGER,
    verdict        TEXT    CHECK (verdict IN ('pass', 'fail')),
    UNIQUE (hostname, cycle, attempt),
    CHECK ((finished_at_ms IS NULL) = (verdict IS NULL))
);

CREATE TABLE check_results (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id     INTEGER NOT NULL REFERENCES runs (id),
    check_name TEXT    NOT NULL,
    verdict    TEXT    NOT NULL CHECK (verdict IN ('pass', 'fail', 'warn', 'skip', 'error')),
    measured   TEXT    NOT NULL DEFAULT '{}',
    message    TEXT    NOT NULL DEFAULT '',
    evidence   TEXT    NOT NULL DEFAULT '',
    UNIQUE (run_id, check_name)
);
