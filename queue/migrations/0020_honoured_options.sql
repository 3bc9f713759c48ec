-- ttl, deadLetterQueue and dlqAfterMaxRetries are honoured from this
-- version on (queue/configure.go, Options). Before it they were stored and
-- did nothing: every message that failed past retryLimit (or was acked
-- dlq) was dead-lettered, and no message expired by ttl. The new defaults
-- keep that: dead_letter_queue and dlq_after_max_retries true (false now
-- drops instead of dead-lettering), ttl 0 (never; a positive ttl now
-- deletes messages older than it at retention). Existing queues get the
-- same values, so the upgrade changes no queue's behaviour: a ttl stored
-- before was never applied, and is applied only once configured again.
ALTER TABLE queues ALTER COLUMN ttl SET DEFAULT 0,
	ALTER COLUMN dead_letter_queue SET DEFAULT true,
	ALTER COLUMN dlq_after_max_retries SET DEFAULT true;

UPDATE queues SET ttl = 0, dead_letter_queue = true, dlq_after_max_retries = true, version = version + 1
WHERE ttl <> 0 OR NOT dead_letter_queue OR NOT dlq_after_max_retries;
