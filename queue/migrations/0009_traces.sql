-- Traces: notes a consumer attaches to one message, an event
-- type and arbitrary JSON, tagged with trace names that follow one business
-- flow across queues.
--
-- A trace names its message by (partition_id, seq), and keeps the message's
-- transaction_id, the key clients read it back by. There is no foreign key
-- to messages, which have none on purpose (push cost; 0001_init.sql), and
-- none is added here: a foreign key would put a trigger on every message
-- delete (retention, queue deletion). Traces have their own retention
-- instead (Store.PruneTraces, from the hygiene loop), and outlive the message
-- until then. The foreign key to partitions costs nothing on the hot path:
-- its check takes a key-share lock, which pushes' no-key-update lock on the
-- partition row does not conflict with; deleting a partition (its queue's
-- deletion, idle-partition cleanup) takes its traces with it.
--
-- created_at is clock_timestamp(), not now(): traces of one message are
-- listed oldest first, and two recorded in one transaction (or in the same
-- microsecond of two) would otherwise tie; id (a UUIDv7) breaks what ties
-- remain.
CREATE TABLE traces (
    id             uuid PRIMARY KEY,
    partition_id   uuid NOT NULL REFERENCES partitions (id) ON DELETE CASCADE,
    seq            bigint NOT NULL,
    transaction_id text NOT NULL,
    consumer_group text NOT NULL,
    event_type     text NOT NULL,
    data           jsonb NOT NULL,
    worker_id      text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    trace_names    text[] NOT NULL DEFAULT '{}'
);

-- The traces of one message, oldest first (GET /traces/{partitionId}/{transactionId});
-- it also serves the cascade from partitions.
CREATE INDEX traces_message ON traces (partition_id, transaction_id, created_at, id);

-- Traces by name: a GIN index over the names array, read with
-- trace_names @> ARRAY[name]. Chosen over a side table of (name, trace id)
-- rows: a trace carries few names, always written and read with the trace,
-- so one row per trace keeps a record to one insert (a side table doubles
-- the writes and needs its own cascade and retention), and GIN's pending
-- list keeps that insert cheap. What it gives up is order: the matches of a
-- name are sorted after the index scan, which is cheap for the names it is
-- meant for (one order, one flow: a handful to thousands of traces). The
-- list of distinct names reads the whole table either way (bounded by
-- retention).
CREATE INDEX traces_names ON traces USING gin (trace_names);

-- Retention (oldest first, in batches) and the from/to window of by-name reads.
CREATE INDEX traces_created_at ON traces (created_at);

-- Appended to, deleted by retention in batches.
ALTER TABLE traces SET (autovacuum_vacuum_scale_factor = 0.05);
