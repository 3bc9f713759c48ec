-- Membership: every running instance has a row, written every
-- 2 s (its last_seen), deleted when it stops. Instances learn their
-- syncnet peers here, whether any instance wakes by NOTIFY, and the digest
-- of each peer's announced consumers (syncnet/members.go). Rows of
-- instances that died are deleted by the others a minute after their
-- last_seen.
CREATE TABLE members (
	id         text PRIMARY KEY,          -- its syncnet server id, or its instance name without syncnet
	sync_addr  text,                      -- host:port its datagrams reach; NULL without syncnet
	session    text NOT NULL,             -- changes when it restarts
	started_at timestamptz NOT NULL,
	last_seen  timestamptz NOT NULL DEFAULT now(),
	listens    boolean NOT NULL,          -- it wakes by NOTIFY (LISTEN)
	digest     bigint NOT NULL DEFAULT 0  -- its syncnet presence digest
);

-- Database-wide chores (hygiene) and when one last ran: one instance at a
-- time (an advisory lock), once per interval whatever the instances.
CREATE TABLE chores (
	name   text PRIMARY KEY,
	ran_at timestamptz NOT NULL
);
