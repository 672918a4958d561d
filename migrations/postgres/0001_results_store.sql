-- Kiln results store, PostgreSQL flavour (production). Keep in step with
-- migrations/sqlite/0001_results_store.sql: same tables, columns and constraints.
-- Times are Unix milliseconds (BIGINT); JSON is JSONB. Integers are BIGINT so both
-- backends decode to i64.

CREATE TABLE racks (
    name          TEXT   PRIMARY KEY,
    created_at_ms BIGINT NOT NULL
);

CREATE TABLE nodes (
    hostname           TEXT   PRIMARY KEY,
    rack               TEXT   NOT NULL REFERENCES racks (name),
    bmc_address        TEXT   NOT NULL,
    gpu_model          TEXT   NOT NULL,
    gpu_count          BIGINT NOT NULL CHECK (gpu_count BETWEEN 0 AND 16),
    firmware_bmc       TEXT   NOT NULL,
    firmware_bios      TEXT   NOT NULL,
    firmware_gpu_vbios TEXT   NOT NULL,
    firmware_nic       TEXT   NOT NULL,
    labels             JSONB  NOT NULL DEFAULT '{}',
    state              TEXT   NOT NULL
        CHECK (state IN ('queued', 'running', 'passed', 'retrying', 'dead_lettered')),
    state_reason       TEXT   NOT NULL DEFAULT '',
    cycle              BIGINT NOT NULL CHECK (cycle >= 1),
    attempt            BIGINT NOT NULL CHECK (attempt >= 1),
    registered_at_ms   BIGINT NOT NULL,
    updated_at_ms      BIGINT NOT NULL
);
CREATE INDEX nodes_by_rack_state ON nodes (rack, state);

CREATE TABLE node_events (
    id       BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hostname TEXT   NOT NULL REFERENCES nodes (hostname),
    at_ms    BIGINT NOT NULL,
    cycle    BIGINT NOT NULL,
    attempt  BIGINT NOT NULL,
    state    TEXT   NOT NULL,
    reason   TEXT   NOT NULL
);
CREATE INDEX node_events_by_hostname ON node_events (hostname, id);

CREATE TABLE runs (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    hostname       TEXT   NOT NULL REFERENCES nodes (hostname),
    cycle          BIGINT NOT NULL CHECK (cycle >= 1),
    attempt        BIGINT NOT NULL CHECK (attempt >= 1),
    agent          TEXT   NOT NULL,
    started_at_ms  BIGINT NOT NULL,
    finished_at_ms BIGINT,
    verdict        TEXT   CHECK (verdict IN ('pass', 'fail')),
    UNIQUE (hostname, cycle, attempt),
    CHECK ((finished_at_ms IS NULL) = (verdict IS NULL))
);

CREATE TABLE check_results (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id     BIGINT NOT NULL REFERENCES runs (id),
    check_name TEXT   NOT NULL,
    verdict    TEXT   NOT NULL CHECK (verdict IN ('pass', 'fail', 'warn', 'skip', 'error')),
    measured   JSONB  NOT NULL DEFAULT '{}',
    message    TEXT   NOT NULL DEFAULT '',
    evidence   TEXT   NOT NULL DEFAULT '',
    UNIQUE (run_id, check_name)
);
