-- Indexes for the operators' dashboard and `kiln status` (kiln-store's dashboard module).
-- Depends only on 0001_results_store.sql.
--
-- The dead-letter list reads nodes by state, newest change first; without this it scans
-- every node. (Per-rack counts already use nodes_by_rack_state from 0001.)
CREATE INDEX nodes_by_state_updated ON nodes (state, updated_at_ms);
