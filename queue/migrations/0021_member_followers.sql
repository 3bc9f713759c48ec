-- Each instance's follow streams per queue ({"queue": count}), written
-- with its row every beat: the console shows a queue's followers on every
-- instance, not only on the one it asks.
ALTER TABLE members ADD COLUMN followers jsonb NOT NULL DEFAULT '{}'::jsonb;
