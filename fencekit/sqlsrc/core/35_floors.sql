-- Key fence floors: the lowest fence a key of a resource starts at when it has no row in
-- fencekit.fences yet. A key fence accepts any token for a key it has never seen; that is right
-- for a new key, but not after `fencekit move` turned a table fence into a key fence (the old
-- table fence had accepted tokens for every key) or split old keys into new ones (an unseen new
-- key may be part of an old key that accepted higher tokens). advance_fences starts an unseen
-- key at the larger of the token and the floor, so a token below the floor is stale there.
-- Keys that already have a fence are not affected. Written by move scripts, by a TRUNCATE that
-- a key fence accepted (advance_fences raises the floor to its token: every key of the
-- resource, seen or not, was written) and by fencekit_admin members repairing fences; nobody
-- else can lower or remove one.
CREATE TABLE IF NOT EXISTS fencekit.floors (
  resource text PRIMARY KEY,
  floor    bigint NOT NULL CHECK (floor > 0),
  set_at   timestamptz NOT NULL DEFAULT pg_catalog.now(),
  reason   text
);

REVOKE ALL ON fencekit.floors FROM PUBLIC;
GRANT SELECT ON fencekit.floors TO PUBLIC;
GRANT ALL ON fencekit.floors TO fencekit_admin;
