-- When a members row last changed in what the others read of it (address,
-- session, start, listens, digest, followers) or came back after going
-- quiet: a beat reads only the rows changed since its last read, and
-- those gone quiet, not every row every beat (queue/members.go).
ALTER TABLE members ADD COLUMN changed_at timestamptz NOT NULL DEFAULT now();
