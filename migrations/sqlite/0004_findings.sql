-- Findings per component (crates/kiln-findings) and dead-letter resolution, SQLite
-- flavour. Keep in step with migrations/postgres/0004_findings.sql. Depends on 0001 and 0002.

-- Each check result's findings: a JSON list of {component, code, action, message, evidence}.
ALTER TABLE check_results ADD COLUMN findings TEXT NOT NULL DEFAULT '[]';

-- The triage service's per-component view of a dead-lettered cycle (components with their
-- findings across attempts, suspects, unreachable), as JSON.
ALTER TABLE triage ADD COLUMN analysis TEXT NOT NULL DEFAULT '{}';
-- The node's manifest labels (a `switch` label groups nodes behind one switch in the report).
ALTER TABLE triage ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
-- `kiln dlq resolve`: who resolved the record, when, and what they did.
ALTER TABLE triage ADD COLUMN resolved_by TEXT;
ALTER TABLE triage ADD COLUMN resolved_note TEXT;
ALTER TABLE triage ADD COLUMN resolved_at_ms INTEGER;
