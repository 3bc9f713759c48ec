-- How a group subscribed to a queue, as the reference server records it:
-- 'new' (it started at its first read), 'timestamp' (from a time it named
-- or one set later), NULL (from the beginning). subscribed_from holds the
-- instant for both.
ALTER TABLE consumer_groups ADD COLUMN subscription_mode text;
UPDATE consumer_groups SET subscription_mode = 'timestamp' WHERE subscribed_from IS NOT NULL;
