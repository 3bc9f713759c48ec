-- Storage hygiene: the hot tables are vacuumed early and often, so dead
-- rows from pushes, acks and retention do not pile up between autovacuum
-- runs; the always-updated rows leave room on their pages for HOT updates.

-- messages: inserted by pushes, deleted by retention.
ALTER TABLE messages SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0);

-- partitions: last_offset and last_push_at change on every push.
ALTER TABLE partitions SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.05);

-- consumers: cursor, done and the lease change on every pop and ack.
ALTER TABLE consumers SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500,
    autovacuum_analyze_scale_factor = 0.05);

-- dead_letters: appended to, deleted by retention later.
ALTER TABLE dead_letters SET (autovacuum_vacuum_scale_factor = 0.05);
