-- A members row written by an instance of a version before changed_at
-- (0023), whose beat leaves the column as it was, still moves it when what
-- the others read of it changes (address, session, start, listens, digest,
-- followers): during a rolling upgrade the new instances read an old one's
-- changes at their next beat, not at their next read of every row (every
-- 30 s), where a digest held stale makes it unreachable to syncnet. The
-- beat of this version moves changed_at itself (queue/members.go), so for
-- it the WHEN is false and the function is not called: the cost is the
-- WHEN's comparison. It may be dropped once no instance older than 0023
-- can run against the database.
CREATE FUNCTION members_changed_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
	NEW.changed_at := now();
	RETURN NEW;
END
$$;

CREATE TRIGGER members_changed_at BEFORE UPDATE ON members FOR EACH ROW
	WHEN (NEW.changed_at = OLD.changed_at
	      AND (NEW.sync_addr, NEW.session, NEW.started_at, NEW.listens, NEW.digest, NEW.followers) IS DISTINCT FROM
	          (OLD.sync_addr, OLD.session, OLD.started_at, OLD.listens, OLD.digest, OLD.followers))
	EXECUTE FUNCTION members_changed_at();
