-- Claiming a resource at grant: the new holder raises the fence to its token before it does
-- anything else, so every older token is stale there from that moment on, not only from the
-- new holder's first write.
--
-- A key or table fence rejects a token lower than the highest it has ACCEPTED. Between a
-- new grant and the new holder's first write the fence still holds the previous holder's
-- token, so that previous holder (paused, partitioned, or a zombie of a primary that failed
-- over and lost the newest fence advances) can still write. Lease-bound fences close the gap
-- by themselves (the token must be the live lease's); the others close it with a claim.
--
-- fencekit.claim(tbl, key_values, token [, issuer]) advances the fence of one key of a
-- key-fenced table (key values in key-column order, as fencekit.key_text reads them), or of a
-- table fence (key_values '{}'), exactly as a write under that token would, and makes the
-- checks a write makes:
--   * privilege: the session's role must hold INSERT, UPDATE or DELETE on the table (judged by
--     the SESSION's role, like the bypass), and the claim takes the table lock a write takes
--     (ROW EXCLUSIVE, with the caller's own rights), so `fencekit move`, rename, unprotect and
--     every other operation that locks writers out waits for it, and it for them;
--   * token: a positive bigint; lower than the fence: refused with YF001 like a stale write;
--   * issuer: a token tagged (argument, or else the session's fencekit.issuer, as a write
--     reads it) with another issuer than the resource's is refused with YF007;
--   * lease: on a lease-bound fence the token must be the live lease token of the key
--     (YF006), as for a write;
--   * on_equal=reject: the token still writes once after the claim (the claim records the
--     token minus one, which under that policy already rejects every older token).
-- Returns the fence before the claim (NULL: none yet). Row fences have a fence per row: a row
-- is claimed by writing it.
--
-- Two functions: fencekit.claim runs as the caller (it evaluates the key values, which may
-- mean a domain of the table owner's: fencekit.key_text reads them as built-in types only, and
-- never runs the domain's code anyway) and takes the lock; fencekit.claim_fence is the only
-- SECURITY DEFINER part and works on text and bigint and fencekit's own tables alone.

-- The definer part. Why definer: it writes fencekit.fences and reads fencekit.leases, which
-- writers may not. Touches: the catalogs (fencekit.protected_table: is tbl the protected
-- table), fencekit.protected (a FOR SHARE lock on the table's row, which move, rename and
-- unprotect wait for: they delete or update that row), fencekit.resources,
-- fencekit.fences (through advance_fences), fencekit.leases (through lease_mismatch). Never
-- runs: any cast, operator, function or trigger of the caller or of the table's owner: its
-- inputs are regclass, text and bigint, it compares them with pg_catalog's operators, and it
-- never reads or writes the user's table.
CREATE OR REPLACE FUNCTION fencekit.claim_fence(
    tbl regclass, key text, token bigint, issuer text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p record;
    r pg_catalog.name := fencekit.session_role();
    old bigint;
    mark bigint;
    bound text;
    tagged text := COALESCE(NULLIF(claim_fence.issuer, ''),
                            NULLIF(pg_catalog.current_setting('fencekit.issuer', true), ''));
    bad_fence bigint;
    bad_reason text;
    lb record;
BEGIN
    IF claim_fence.token IS NULL OR claim_fence.token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'YF004',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: token must be a positive bigint, '
                                        'got %s', claim_fence.tbl,
                                        COALESCE(claim_fence.token::text, 'NULL'));
    END IF;
    IF NOT pg_catalog.has_table_privilege(r, claim_fence.tbl, 'INSERT, UPDATE, DELETE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: role %I may not write this table',
                                        claim_fence.tbl, r),
            HINT = 'A claim does what a write would: it needs INSERT, UPDATE or DELETE on the table.';
    END IF;
    -- The registry row, share-locked until commit: a move, rename or unprotect of the table
    -- (each deletes or updates it) waits for this claim, and this claim for them. The second
    -- try sees the row such an operation wrote when it committed while we waited.
    FOR i IN 1 .. 2 LOOP
        SELECT pr.scope, pr.resource, pr.spec, pr.tag INTO p FROM fencekit.protected pr
         WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name))
               OPERATOR(pg_catalog.=) claim_fence.tbl
           FOR SHARE;
        EXIT WHEN FOUND;
    END LOOP;
    IF p.scope IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s is not protected', claim_fence.tbl),
            HINT = 'fencekit status lists the protected tables.';
    END IF;
    -- Only the protected table itself, never another that took its name (its writers would
    -- raise the protected table's fences): fencekit.protected_table reads the catalogs only.
    IF fencekit.protected_table(p.tag) IS DISTINCT FROM claim_fence.tbl
       AND fencekit.protected_table(p.tag) IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s is not the table protected under '
                                        'that name', claim_fence.tbl),
            HINT = 'fencekit status reports where the protected table is.';
    END IF;
    IF p.scope OPERATOR(pg_catalog.=) 'row' THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s has a row fence, one fence per row',
                                        claim_fence.tbl),
            HINT = 'Claim a row by writing it under the token (e.g. UPDATE ... SET col = col '
                   'WHERE <primary key>), or protect the table with a key fence.';
    END IF;
    IF claim_fence.key IS NULL
       OR (p.scope OPERATOR(pg_catalog.=) 'table' AND claim_fence.key OPERATOR(pg_catalog.<>) '')
    THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s has a %s fence: key %L does not name '
                                        'one of its fences', claim_fence.tbl, p.scope,
                                        claim_fence.key);
    END IF;
    -- Issuer: as a write, a token tagged with another issuer than the resource's is refused.
    SELECT rs.issuer INTO bound FROM fencekit.resources rs
     WHERE rs.resource OPERATOR(pg_catalog.=) p.resource;
    bound := COALESCE(bound, p.spec OPERATOR(pg_catalog.->>) 'issuer');
    IF bound IS NOT NULL AND tagged IS NOT NULL AND tagged OPERATOR(pg_catalog.<>) bound THEN
        RAISE EXCEPTION USING ERRCODE = 'YF007',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: resource %L takes tokens from '
                                        'issuer %L, not %L', claim_fence.tbl, p.resource, bound,
                                        tagged),
            DETAIL = pg_catalog.json_build_object(
                'reason', 'issuer_mismatch', 'table', claim_fence.tbl::text,
                'resource', p.resource, 'token', claim_fence.token, 'issuer', tagged,
                'expected_issuer', bound)::text;
    END IF;
    -- Lease: on a lease-bound fence a write must carry the live lease's token; so must a claim.
    IF COALESCE((p.spec OPERATOR(pg_catalog.->>) 'lease_bound')::boolean, false) THEN
        SELECT * INTO lb FROM fencekit.lease_mismatch(p.resource, ARRAY[claim_fence.key],
                                                      claim_fence.token);
        IF lb.bad_key IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'YF006',
                MESSAGE = pg_catalog.format(
                    'fencekit.claim on %s: token %s is not the current lease token (%s) of '
                    'resource %s', claim_fence.tbl, claim_fence.token,
                    COALESCE(lb.lease_token::text, 'no lease'),
                    fencekit.lease_resource(p.resource, claim_fence.key)),
                DETAIL = pg_catalog.json_build_object(
                    'reason', 'lease_mismatch', 'table', claim_fence.tbl::text,
                    'resource', p.resource, 'key', claim_fence.key, 'token', claim_fence.token,
                    'fence', lb.lease_token)::text,
                HINT = 'The lease was lost or never held. Acquire the lease again before '
                       'claiming.';
        END IF;
    END IF;
    old := fencekit.current_fence(p.resource, claim_fence.key);
    -- Under on_equal=reject a fence rejects its own token too (but for the transaction that
    -- raised it): a claim recording the token itself would use it up, and the holder's first
    -- write would fail. The token minus one rejects every older token just the same.
    mark := claim_fence.token;
    IF (p.spec OPERATOR(pg_catalog.->>) 'on_equal') OPERATOR(pg_catalog.=) 'reject' THEN
        mark := claim_fence.token OPERATOR(pg_catalog.-) 1;
    END IF;
    IF mark OPERATOR(pg_catalog.>=) 1 THEN
        SELECT b.bad_fence, b.bad_reason INTO bad_fence, bad_reason
          FROM fencekit.advance_fences(p.resource, ARRAY[claim_fence.key], mark, 'accept') b;
    ELSIF old IS NOT NULL THEN  -- token 1 under on_equal=reject: no older token to refuse
        bad_fence := old;
        bad_reason := 'stale';
    END IF;
    IF bad_reason OPERATOR(pg_catalog.=) 'stale' THEN
        IF bad_fence OPERATOR(pg_catalog.=) claim_fence.token THEN
            RAISE EXCEPTION USING ERRCODE = 'YF002',
                MESSAGE = pg_catalog.format('fencekit.claim on %s: token %s was already used on '
                                            'resource %L key %L, which accepts each token once',
                                            claim_fence.tbl, claim_fence.token, p.resource,
                                            claim_fence.key),
                DETAIL = pg_catalog.json_build_object(
                    'reason', 'reused', 'table', claim_fence.tbl::text, 'resource', p.resource,
                    'key', claim_fence.key, 'token', claim_fence.token,
                    'fence', bad_fence)::text,
                HINT = 'Acquire a new lease (a new token).';
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'YF001',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: token %s is lower than the fence %s '
                                        'of resource %L key %L', claim_fence.tbl,
                                        claim_fence.token, bad_fence, p.resource,
                                        claim_fence.key),
            DETAIL = pg_catalog.json_build_object(
                'reason', 'stale', 'table', claim_fence.tbl::text, 'resource', p.resource,
                'key', claim_fence.key, 'token', claim_fence.token, 'fence', bad_fence)::text,
            HINT = 'A newer holder has claimed or written this resource: the lease is superseded.';
    ELSIF bad_reason IS NOT NULL AND bad_reason OPERATOR(pg_catalog.<>) 'reused' THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: %s', claim_fence.tbl, bad_reason);
    END IF;
    RETURN old;
END;
$fn$;

COMMENT ON FUNCTION fencekit.claim_fence(regclass, text, bigint, text) IS
    'fencekit: the definer part of fencekit.claim (call that): raises a key or table fence, '
    'given as key text, to a token; needs write privilege on the table.';

-- The caller's part: runs as the caller, with its rights. It takes the lock a write takes and
-- names the key (fencekit.key_text: built-in types only), then hands text and bigint to
-- claim_fence.
CREATE OR REPLACE FUNCTION fencekit.claim(
    tbl regclass, key_values text[], token bigint, issuer text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r pg_catalog.name := fencekit.session_role();
    sc text;
    k text := '';
BEGIN
    IF NOT pg_catalog.has_table_privilege(r, claim.tbl, 'INSERT, UPDATE, DELETE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: role %I may not write this table',
                                        claim.tbl, r),
            HINT = 'A claim does what a write would: it needs INSERT, UPDATE or DELETE on the table.';
    END IF;
    -- The lock a write takes (and needs the rights a write needs): operations that lock writers
    -- out (move, rename, repair scripts, unprotect) exclude the claim, and it them.
    -- dynamic SQL: LOCK TABLE takes no parameter; the table is a regclass known at run time
    EXECUTE pg_catalog.format('LOCK TABLE ONLY %s IN ROW EXCLUSIVE MODE', claim.tbl);
    SELECT pr.scope INTO sc FROM fencekit.protected pr
     WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name))
           OPERATOR(pg_catalog.=) claim.tbl;
    IF sc OPERATOR(pg_catalog.=) 'key' THEN
        k := fencekit.key_text(claim.tbl, claim.key_values);
    ELSIF sc OPERATOR(pg_catalog.=) 'table'
          AND pg_catalog.cardinality(COALESCE(claim.key_values, '{}')) OPERATOR(pg_catalog.<>) 0
    THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s has a table fence: it takes no '
                                        'key values', claim.tbl);
    END IF;
    RETURN fencekit.claim_fence(claim.tbl, k, claim.token, claim.issuer);
END;
$fn$;

COMMENT ON FUNCTION fencekit.claim(regclass, text[], bigint, text) IS
    'fencekit: raise a key or table fence to a new lease''s token at grant (older tokens are '
    'stale from then on), as a write under that token would; needs write privilege on the table.';

REVOKE ALL ON FUNCTION fencekit.claim(regclass, text[], bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.claim(regclass, text[], bigint, text) TO PUBLIC;
-- claim_fence checks the session's write privilege itself; claim (which anyone may call)
-- calls it with the caller's rights.
REVOKE ALL ON FUNCTION fencekit.claim_fence(regclass, text, bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.claim_fence(regclass, text, bigint, text) TO PUBLIC;
