-- fencekit core: leases and fencing tokens issued by PostgreSQL itself.
-- Part of the core install (concatenated in name order inside one transaction, after the schema
-- "fencekit" and the role fencekit_admin exist). Idempotent: safe to run again, and over an
-- older install.
--
-- One row per resource holds the LAST TOKEN ever issued for it and the current holder, if any.
-- A grant increments that token in the same transaction that records the holder, so tokens are
-- transactional and as durable as any committed row: they survive release, expiry, takeover,
-- crash and restart. A sequence would not do: nextval() is not rolled back, is WAL-logged in
-- batches (a crash can hand out a value again) and a promoted async standby may lag behind it.
-- Rows are never deleted: deleting one would restart that resource's tokens at 1.
--
-- Expiry is judged by this server's clock alone, read with clock_timestamp() after the row
-- lock is held: now() is the start of the caller's transaction, which can be arbitrarily old
-- (a long transaction, a wait for the row lock), and client clocks are never consulted.

CREATE TABLE IF NOT EXISTS fencekit.leases (
    resource    text PRIMARY KEY,
    holder      text,                         -- NULL: free (released, or never held)
    token       bigint NOT NULL,              -- last token issued for this resource
    acquired_at timestamptz,                  -- when the current/last holder got the token
    renewed_at  timestamptz,
    expires_at  timestamptz,                  -- NULL once released
    released_at timestamptz,
    -- The role that acquired the current grant: the session's role (fencekit.session_role():
    -- the SET ROLE role, else the login role), never current_user, which inside these SECURITY
    -- DEFINER functions is their owner. A live grant belongs to it: another role cannot take
    -- it over by sending its holder name to acquire, nor renew or release it (members of
    -- fencekit_admin may renew and release, never take), so one application cannot take
    -- another's leases.
    acquired_by name,
    CONSTRAINT leases_resource_not_empty CHECK (resource <> ''),
    CONSTRAINT leases_token_positive CHECK (token > 0),
    CONSTRAINT leases_holder_has_expiry CHECK (holder IS NULL OR expires_at IS NOT NULL)
);
-- A rejection looks a token up here (fencekit.reject: is the stale token a live lease?).
CREATE INDEX IF NOT EXISTS leases_token ON fencekit.leases (token);

-- Tokens are also unique across resources on this server: a grant takes the larger of the
-- resource's last token + 1 and the epoch's base plus the next value of this sequence. The
-- sequence is only a salt (a crash may skip values, an async failover may rewind it): the
-- per-resource order comes from the row above, as durable as any commit, and the order across a
-- promotion from the epoch below. Uniqueness is what lets a lease-bound fence refuse a token
-- granted for another resource.
CREATE SEQUENCE IF NOT EXISTS fencekit.lease_token_seq;
REVOKE ALL ON SEQUENCE fencekit.lease_token_seq FROM PUBLIC;

-- ------------------------------------------------------------------ epochs (failover)
--
-- An asynchronous standby promoted after a failover may not have received the newest grants:
-- its copy of fencekit.leases (and of the sequence) is older than what holders were told. Had
-- tokens come from that copy alone, the new primary would grant again a token a zombie of the
-- old primary still holds. So a token carries an EPOCH in its high bits: the timeline of this
-- server's WAL, which every promotion raises (PostgreSQL picks a timeline above every one it
-- knows of) and which a crash restart without promotion keeps (a restart loses no committed
-- grant). Token = epoch * 2^40 + n, n < 2^40: every token granted after a promotion is above
-- every token granted before it, including grants the standby never received.
--
-- The timeline is read from the name of the WAL file being written now: it is live at once,
-- unlike pg_control_checkpoint().timeline_id, which lags a promotion until the end-of-recovery
-- checkpoint. Both functions are executable by PUBLIC on PostgreSQL 13 to 18.
CREATE OR REPLACE FUNCTION fencekit.lease_epoch() RETURNS bigint
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.substr(
               pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_insert_lsn()), 1, 8)
           )::pg_catalog.bit(32)::pg_catalog.int8
$fn$;

COMMENT ON FUNCTION fencekit.lease_epoch() IS
    'fencekit: the epoch of new lease tokens (this server''s WAL timeline); '
    'token >> 40 is the epoch a token was granted in.';

-- The lowest token of the current epoch plus a fresh salt from the sequence.
CREATE OR REPLACE FUNCTION fencekit._lease_next_token() RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    epoch bigint := fencekit.lease_epoch();
    salt  bigint := pg_catalog.nextval('fencekit.lease_token_seq');
BEGIN
    -- 2^23 timelines of 2^40 tokens fill a bigint exactly.
    IF epoch OPERATOR(pg_catalog.>=) 8388608 OR salt OPERATOR(pg_catalog.>=) 1099511627776 THEN
        RAISE EXCEPTION 'fencekit lease: tokens exhausted (timeline %, sequence %)', epoch, salt
            USING ERRCODE = '22003';
    END IF;
    RETURN epoch OPERATOR(pg_catalog.*) 1099511627776 OPERATOR(pg_catalog.+) salt;
END;
$fn$;

COMMENT ON TABLE fencekit.leases IS
    'fencekit leases: one row per resource with its last issued fencing token. '
    'Written only through fencekit.acquire/renew/release; '
    'never delete rows (tokens would restart).';

-- Application roles never touch the table: they call the SECURITY DEFINER functions below.
--
-- Trusted surface (docs/security.md): acquire, renew and release are SECURITY DEFINER because
-- they write fencekit.leases, which no application may write (lowering a token there would let
-- an old token pass a fence again), and take tokens from fencekit.lease_token_seq. They touch
-- only that table and sequence, and read the WAL position (lease_epoch). Before any lock they
-- check the session's role (_lease_require_writer), and a grant is its role's
-- (_lease_owned). lease_token is SECURITY DEFINER because it locks a lease row FOR SHARE, which
-- needs a right on fencekit.leases that nobody else holds; it only reads that row, for
-- fencekit_admin and the lease-bound fences' definer triggers. None of them runs caller code:
-- their arguments are text, bigint and interval, compared with pg_catalog's operators written
-- as OPERATOR(pg_catalog.x), no user type, table, trigger or policy is reached (fencekit.leases
-- has none: only its owner could add one), and search_path is pinned.
REVOKE ALL ON TABLE fencekit.leases FROM PUBLIC;

-- ------------------------------------------------------------------ input checks

CREATE OR REPLACE FUNCTION fencekit._lease_check_args(
    resource text, holder text, ttl interval
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF resource IS NULL OR resource OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'fencekit lease: resource must be a non-empty name'
            USING ERRCODE = '22023', HINT = 'Name what the lease guards, e.g. ''billing:42''.';
    END IF;
    IF pg_catalog.octet_length(resource) OPERATOR(pg_catalog.>) 1024 THEN
        RAISE EXCEPTION 'fencekit lease: resource name is % bytes long, the limit is 1024',
            pg_catalog.octet_length(resource)
            USING ERRCODE = '22023';
    END IF;
    IF holder IS NULL OR holder OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION 'fencekit lease on "%": holder must be a non-empty name', resource
            USING ERRCODE = '22023', HINT = 'Use a name unique to the worker, e.g. host:pid:uuid.';
    END IF;
    IF pg_catalog.octet_length(holder) OPERATOR(pg_catalog.>) 1024 THEN
        RAISE EXCEPTION 'fencekit lease on "%": holder name is % bytes long, the limit is 1024',
            resource, pg_catalog.octet_length(holder)
            USING ERRCODE = '22023';
    END IF;
    IF ttl IS NULL OR ttl OPERATOR(pg_catalog.<=) interval '0' THEN
        RAISE EXCEPTION 'fencekit lease on "%": ttl must be positive, got %', resource,
            COALESCE(ttl::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    -- A lease longer than a day is a lock that outlives its holder's crash for too long: renew a
    -- shorter lease instead. Months are rejected too (their length depends on the date).
    IF ttl OPERATOR(pg_catalog.>) interval '1 day'
       OR pg_catalog.date_part('month', ttl) OPERATOR(pg_catalog.<>) 0
       OR pg_catalog.date_part('year', ttl) OPERATOR(pg_catalog.<>) 0 THEN
        RAISE EXCEPTION 'fencekit lease on "%": ttl % is longer than the 1 day limit', resource, ttl
            USING ERRCODE = '22023', HINT = 'Use a short ttl and renew the lease while working.';
    END IF;
END;
$fn$;

-- A token must outlive the server's crash before the client sees it. Raise this transaction's
-- synchronous_commit to at least 'on' (never lower it: remote_write/remote_apply stay) so that
-- the commit is flushed locally and, with synchronous standbys, on them too.
CREATE OR REPLACE FUNCTION fencekit._lease_durable_commit() RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) ANY
       (ARRAY['off', 'local', 'false', 'no', '0']) THEN
        -- is_local = true: lasts until the end of the caller's transaction, i.e. its commit.
        PERFORM pg_catalog.set_config('synchronous_commit', 'on', true);
    END IF;
END;
$fn$;

-- Whether the session's role acquired a grant made by role `owner` (NULL: a grant from before
-- roles were recorded, anyone's). Equality, not membership: a member of `owner` acts as it
-- only after SET ROLE.
CREATE OR REPLACE FUNCTION fencekit._lease_owned(owner name) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT owner IS NULL OR owner OPERATOR(pg_catalog.=) fencekit.session_role()
$fn$;

-- Whether the session may renew or release a grant made by role `owner`: its own, or any as a
-- member of fencekit_admin (to free a crashed worker's lease by hand).
CREATE OR REPLACE FUNCTION fencekit._lease_caller_may(owner name) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT fencekit._lease_owned(owner)
        OR pg_catalog.pg_has_role(fencekit.session_role(), 'fencekit_admin', 'MEMBER')
$fn$;

-- Only members of fencekit_writer may take, renew or release leases from this issuer. Judged by
-- the SESSION's role (the SET ROLE role, else the login role), never current_user: inside these
-- SECURITY DEFINER functions current_user is their owner. Called first, before any lock or
-- write, so that a role outside fencekit_writer cannot hold a lease row lock another role waits
-- on. Superusers pass (members of every role), and so does fencekit_admin (granted
-- fencekit_writer by the install).
CREATE OR REPLACE FUNCTION fencekit._lease_require_writer(fn text, resource text) RETURNS void
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r text := fencekit.session_role();
BEGIN
    IF pg_catalog.pg_has_role(r::pg_catalog.name, 'fencekit_writer', 'MEMBER') THEN
        RETURN;
    END IF;
    RAISE EXCEPTION USING
        ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format(
            'fencekit.%s: role %I may not use fencekit''s lease issuer: it is not a member of '
            'fencekit_writer', fn, r),
        DETAIL = pg_catalog.json_build_object(
            'reason', 'usage', 'role', r, 'resource', resource,
            'missing_grant', 'fencekit_writer')::text,
        HINT = pg_catalog.format(
            'GRANT fencekit_writer TO %I;', r);
END;
$fn$;

-- ------------------------------------------------------------------ acquire

-- The token of a new grant, or NULL when another holder's lease is live. The current holder
-- calling again gets a NEW token (its old one stops renewing): that is how a client recovers
-- after a lost reply, so give every lease instance its own holder name. "The current holder" is
-- the holder name AND the role that acquired the grant (fencekit._lease_owned): another role
-- sending the same name gets NULL while the grant is live, like any other holder. No exception
-- for fencekit_admin: an administrator releases a lease, then acquires it under its own name.
CREATE OR REPLACE FUNCTION fencekit.acquire(resource text, holder text, ttl interval)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cur   fencekit.leases%ROWTYPE;
    t_now   timestamptz;
    t_next  bigint;
BEGIN
    PERFORM fencekit._lease_require_writer('acquire', acquire.resource);
    PERFORM fencekit._lease_check_args(acquire.resource, acquire.holder, acquire.ttl);

    -- First grant ever: the row does not exist yet. The insert itself is the grant;
    -- a concurrent first acquirer waits on the unique index and then sees the row below.
    t_now := pg_catalog.clock_timestamp();
    INSERT INTO fencekit.leases AS l
           (resource, holder, token, acquired_at, renewed_at, expires_at, acquired_by)
    VALUES (acquire.resource, acquire.holder, fencekit._lease_next_token(),
            t_now, t_now,
            t_now OPERATOR(pg_catalog.+) acquire.ttl, fencekit.session_role())
    ON CONFLICT ON CONSTRAINT leases_pkey DO NOTHING
    RETURNING l.token INTO t_next;
    IF t_next IS NOT NULL THEN
        PERFORM fencekit._lease_durable_commit();
        RETURN t_next;
    END IF;

    -- Otherwise lock the row, and only then read the clock: the wait for the lock must not
    -- make a live lease look expired, nor an expired one live.
    SELECT * INTO cur FROM fencekit.leases AS l
     WHERE l.resource OPERATOR(pg_catalog.=) acquire.resource
       FOR UPDATE;
    t_now := pg_catalog.clock_timestamp();

    IF cur.holder IS NOT NULL
       AND cur.expires_at OPERATOR(pg_catalog.>) t_now
       AND (cur.holder OPERATOR(pg_catalog.<>) acquire.holder
            OR NOT fencekit._lease_owned(cur.acquired_by)) THEN
        RETURN NULL;  -- held by another live holder (another name, or the name of another role)
    END IF;

    IF cur.token OPERATOR(pg_catalog.>=) 9223372036854775807 THEN
        RAISE EXCEPTION 'fencekit lease on "%": tokens exhausted', acquire.resource
            USING ERRCODE = '22003';
    END IF;
    t_next := GREATEST(cur.token OPERATOR(pg_catalog.+) 1, fencekit._lease_next_token());

    UPDATE fencekit.leases AS l
       SET holder = acquire.holder, token = t_next, acquired_at = t_now, renewed_at = t_now,
           expires_at = t_now OPERATOR(pg_catalog.+) acquire.ttl, released_at = NULL,
           acquired_by = fencekit.session_role()
     WHERE l.resource OPERATOR(pg_catalog.=) acquire.resource;
    PERFORM fencekit._lease_durable_commit();
    RETURN t_next;
END;
$fn$;

-- ------------------------------------------------------------------ renew

-- True when the lease was extended to clock + ttl; false once it has expired (even if nobody
-- took it: an expired lease is lost, its holder must acquire again), was released, or
-- belongs to another holder or token.
CREATE OR REPLACE FUNCTION fencekit.renew(resource text, holder text, token bigint, ttl interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cur fencekit.leases%ROWTYPE;
    t_now timestamptz;
BEGIN
    PERFORM fencekit._lease_require_writer('renew', renew.resource);
    PERFORM fencekit._lease_check_args(renew.resource, renew.holder, renew.ttl);
    IF renew.token IS NULL OR renew.token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'fencekit lease on "%": token must be a positive integer, got %',
            renew.resource, COALESCE(renew.token::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;

    SELECT * INTO cur FROM fencekit.leases AS l
     WHERE l.resource OPERATOR(pg_catalog.=) renew.resource
       FOR UPDATE;
    t_now := pg_catalog.clock_timestamp();
    IF NOT FOUND
       OR cur.holder IS DISTINCT FROM renew.holder
       OR cur.token OPERATOR(pg_catalog.<>) renew.token
       OR cur.expires_at OPERATOR(pg_catalog.<=) t_now
       OR NOT fencekit._lease_caller_may(cur.acquired_by) THEN
        RETURN false;
    END IF;

    UPDATE fencekit.leases AS l
       SET renewed_at = t_now, expires_at = t_now OPERATOR(pg_catalog.+) renew.ttl
     WHERE l.resource OPERATOR(pg_catalog.=) renew.resource;
    PERFORM fencekit._lease_durable_commit();
    RETURN true;
END;
$fn$;

-- ------------------------------------------------------------------ release

-- True when this holder's grant was cleared (expired but not taken over counts: the holder is
-- done with it). False for anyone else: a non-holder, or an old token, cannot free a lease.
CREATE OR REPLACE FUNCTION fencekit.release(resource text, holder text, token bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    done boolean;
BEGIN
    PERFORM fencekit._lease_require_writer('release', release.resource);
    PERFORM fencekit._lease_check_args(release.resource, release.holder, interval '1 second');
    IF release.token IS NULL OR release.token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION 'fencekit lease on "%": token must be a positive integer, got %',
            release.resource, COALESCE(release.token::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;

    UPDATE fencekit.leases AS l
       SET holder = NULL, expires_at = NULL, released_at = pg_catalog.clock_timestamp()
     WHERE l.resource OPERATOR(pg_catalog.=) release.resource
       AND l.holder OPERATOR(pg_catalog.=) release.holder
       AND l.token OPERATOR(pg_catalog.=) release.token
       AND fencekit._lease_caller_may(l.acquired_by)
    RETURNING true INTO done;
    RETURN COALESCE(done, false);
END;
$fn$;

-- ------------------------------------------------------------------ reads

-- The live lease token of a resource, or NULL when nobody holds a live lease. For lease-bound
-- fences: FOR SHARE makes a concurrent acquire wait until the checking transaction ends, so a
-- write accepted under token N cannot commit after token N+1 was granted.
CREATE OR REPLACE FUNCTION fencekit.lease_token(resource text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cur fencekit.leases%ROWTYPE;
BEGIN
    SELECT * INTO cur FROM fencekit.leases AS l
     WHERE l.resource OPERATOR(pg_catalog.=) lease_token.resource
       FOR SHARE;
    IF NOT FOUND OR cur.holder IS NULL
       OR cur.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp() THEN
        RETURN NULL;
    END IF;
    RETURN cur.token;
END;
$fn$;

-- Live leases only (judged by the server clock when the view is read).
CREATE OR REPLACE VIEW fencekit.leases_current AS
SELECT l.resource,
       l.holder,
       l.token,
       l.acquired_at,
       l.renewed_at,
       l.expires_at,
       l.expires_at OPERATOR(pg_catalog.-) pg_catalog.clock_timestamp() AS expires_in
  FROM fencekit.leases AS l
 WHERE l.holder IS NOT NULL
   AND l.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp();

COMMENT ON VIEW fencekit.leases_current IS
    'fencekit: leases live now by the server clock (resource, holder, token, expiry).';

-- ------------------------------------------------------------------ privileges

-- acquire/renew/release are executable by PUBLIC but refuse roles outside fencekit_writer
-- themselves (fencekit's own YF000 error and hint, rather than a bare "permission denied").
-- Anyone who may use the schema sees who holds what; nobody but the owner writes
-- fencekit.leases.
REVOKE ALL ON FUNCTION fencekit._lease_check_args(text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencekit._lease_durable_commit() FROM PUBLIC;
REVOKE ALL ON FUNCTION fencekit._lease_next_token() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.lease_epoch() TO PUBLIC;
REVOKE ALL ON FUNCTION fencekit._lease_require_writer(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION fencekit._lease_owned(name), fencekit._lease_caller_may(name) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.acquire(text, text, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.renew(text, text, bigint, interval) TO PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.release(text, text, bigint) TO PUBLIC;
-- lease_token takes a FOR SHARE lock that acquire waits on: a role free to call it could stall
-- every lease handover. Lease-bound fences reach it through fencekit.lease_mismatch (SECURITY
-- DEFINER, owned by the installer). Older installs granted it to PUBLIC: this revokes it.
REVOKE ALL ON FUNCTION fencekit.lease_token(text) FROM PUBLIC;
GRANT SELECT ON fencekit.leases_current TO PUBLIC;

DO $do$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_roles AS r
                WHERE r.rolname OPERATOR(pg_catalog.=) 'fencekit_admin') THEN
        -- Admins may read the whole table (last tokens of free resources) but not write it:
        -- lowering a token there would let an old token pass a fence again.
        GRANT SELECT ON TABLE fencekit.leases TO fencekit_admin;
        GRANT EXECUTE ON FUNCTION fencekit.lease_token(text) TO fencekit_admin;
    END IF;
END;
$do$;
