-- Herald queue schema, version 1. Tables live in the connection's current schema
-- (search_path), so tests can run in isolated schemas.

CREATE TABLE queues (
    id                          uuid PRIMARY KEY,
    name                        text NOT NULL UNIQUE,
    namespace                   text NOT NULL DEFAULT '',
    task                        text NOT NULL DEFAULT '',
    lease_time                  integer NOT NULL DEFAULT 300,   -- seconds
    retry_limit                 integer NOT NULL DEFAULT 3,
    retry_delay                 integer NOT NULL DEFAULT 1000,  -- milliseconds
    delayed_processing          integer NOT NULL DEFAULT 0,     -- seconds
    window_buffer               integer NOT NULL DEFAULT 0,     -- seconds
    max_size                    integer NOT NULL DEFAULT 0,
    ttl                         integer NOT NULL DEFAULT 3600,
    retention_seconds           integer NOT NULL DEFAULT 0,
    completed_retention_seconds integer NOT NULL DEFAULT 0,
    retention_enabled           boolean NOT NULL DEFAULT false,
    dead_letter_queue           boolean NOT NULL DEFAULT false,
    dlq_after_max_retries       boolean NOT NULL DEFAULT false,
    priority                    integer NOT NULL DEFAULT 0,
    encryption_enabled          boolean NOT NULL DEFAULT false,
    max_wait_time_seconds       integer NOT NULL DEFAULT 0,
    version                     bigint NOT NULL DEFAULT 1,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX queues_namespace_task ON queues (namespace, task);

-- last_offset is the highest offset handed out in the partition. Offsets are
-- dense and assigned under this row's lock, so commit order equals offset order.
CREATE TABLE partitions (
    id           uuid PRIMARY KEY,
    queue_id     uuid NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
    name         text NOT NULL,
    last_offset  bigint NOT NULL DEFAULT 0,
    last_push_at timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
);

-- No foreign key to partitions: its trigger cost a third of a push's
-- execution time. Pushes hold the partition row lock while inserting and
-- DeleteQueue takes the same locks before deleting messages, so no message
-- can outlive its partition.
CREATE TABLE messages (
    partition_id   uuid NOT NULL,
    seq            bigint NOT NULL,
    id             uuid NOT NULL,
    transaction_id text NOT NULL,
    trace_id       uuid,
    producer_sub   text,
    payload        jsonb NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (partition_id, seq),
    UNIQUE (partition_id, transaction_id)
);

-- A consumer group's first subscription to a queue. subscribed_from is NULL for
-- "all" (everything in the queue) or the instant from which messages count.
CREATE TABLE consumer_groups (
    queue_id        uuid NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
    name            text NOT NULL,
    subscribed_from timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, name)
);

-- One row per (partition, consumer group). Every offset <= cursor is done for the
-- group; done holds finished offsets above the cursor (acked out of order). A
-- lease covers offsets lease_from..lease_to. attempts counts failed deliveries of
-- offset attempt_seq (the first unfinished offset when it failed).
CREATE TABLE consumers (
    partition_id     uuid NOT NULL REFERENCES partitions (id) ON DELETE CASCADE,
    consumer_group   text NOT NULL,
    cursor           bigint NOT NULL DEFAULT 0,
    done             bigint[] NOT NULL DEFAULT '{}',
    lease_id         uuid,
    lease_owner      text,
    lease_expires_at timestamptz,
    lease_from       bigint,
    lease_to         bigint,
    leased_at        timestamptz,
    attempts         integer NOT NULL DEFAULT 0,
    attempt_seq      bigint NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
);
CREATE INDEX consumers_lease_id ON consumers (lease_id) WHERE lease_id IS NOT NULL;

CREATE TABLE dead_letters (
    id              bigserial PRIMARY KEY,
    queue_id        uuid NOT NULL REFERENCES queues (id) ON DELETE CASCADE,
    partition_id    uuid NOT NULL REFERENCES partitions (id) ON DELETE CASCADE,
    seq             bigint NOT NULL,
    message_id      uuid NOT NULL,
    transaction_id  text NOT NULL,
    trace_id        uuid,
    producer_sub    text,
    payload         jsonb NOT NULL,
    created_at      timestamptz NOT NULL,
    consumer_group  text NOT NULL,
    error           text,
    retry_count     integer NOT NULL,
    failed_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_queue ON dead_letters (queue_id, consumer_group, id);
