-- Claiming a resource at grant: the new holder raises the fence to its token before it does
-- anything else, so every older token is stale there from that moment on, not only from the
-- new holder's first write.
--
-- A key or table fence rejects a token lower than the highest one it has ACCEPTED. Between a
-- new grant and the new holder's first write the fence still holds the previous holder's
-- token, so that previous holder (paused, partitioned, or a zombie of a primary that failed
-- over and lost the newest fence advances) can still write. Lease-bound fences close the gap
-- by themselves (the token must be the live lease's); the others close it with a claim.
--
-- fencekit.claim(tbl, key_values, token [, issuer]) advances the fence of one key of a
-- key-fenced table (key values in key-column order, as fencekit.key_text reads them), or of a
-- table fence (key_values '{}'), exactly as a write under that token would: one atomic upsert
-- through fencekit.advance_fences, floors honoured. It needs no more than a write does: the
-- session's role must hold INSERT, UPDATE or DELETE on the table (judged by the SESSION's role,
-- like the bypass: this function is SECURITY DEFINER). A token lower than the fence is refused
-- with YF001 like a stale write (the claimant's lease is already superseded); a token tagged
-- with another issuer than the resource's with YF007. Returns the fence before the claim (NULL:
-- none yet). Row fences have a fence per row: a row is claimed by writing it.

CREATE OR REPLACE FUNCTION fencekit.claim(
    tbl regclass, key_values text[], token bigint, issuer text DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p record;
    r text := pg_catalog.current_setting('role');
    k text;
    old bigint;
    bound text;
    bad record;
BEGIN
    IF r IS NULL OR r OPERATOR(pg_catalog.=) 'none' THEN
        r := session_user;
    END IF;
    IF claim.token IS NULL OR claim.token OPERATOR(pg_catalog.<=) 0 THEN
        RAISE EXCEPTION USING ERRCODE = 'YF004',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: token must be a positive bigint, '
                                        'got %s', claim.tbl, COALESCE(claim.token::text, 'NULL'));
    END IF;
    SELECT pr.* INTO p FROM fencekit.protected pr
     WHERE pg_catalog.to_regclass(pg_catalog.format('%I.%I', pr.schema_name, pr.table_name))
           OPERATOR(pg_catalog.=) claim.tbl;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s is not protected', claim.tbl),
            HINT = 'fencekit status lists the protected tables.';
    END IF;
    IF NOT pg_catalog.has_table_privilege(r::pg_catalog.name, claim.tbl, 'INSERT, UPDATE, DELETE')
    THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: role %I may not write this table',
                                        claim.tbl, r),
            HINT = 'A claim does what a write would: it needs INSERT, UPDATE or DELETE on the table.';
    END IF;
    IF p.scope OPERATOR(pg_catalog.=) 'row' THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim: %s has a row fence, one fence per row',
                                        claim.tbl),
            HINT = 'Claim a row by writing it under the token (e.g. UPDATE ... SET col = col '
                   'WHERE <primary key>), or protect the table with a key fence.';
    ELSIF p.scope OPERATOR(pg_catalog.=) 'table' THEN
        IF pg_catalog.cardinality(COALESCE(claim.key_values, '{}')) OPERATOR(pg_catalog.<>) 0 THEN
            RAISE EXCEPTION USING ERRCODE = 'YF000',
                MESSAGE = pg_catalog.format('fencekit.claim: %s has a table fence: it takes no '
                                            'key values', claim.tbl);
        END IF;
        k := '';
    ELSE
        k := fencekit.key_text(claim.tbl, claim.key_values);
    END IF;
    SELECT rs.issuer INTO bound FROM fencekit.resources rs
     WHERE rs.resource OPERATOR(pg_catalog.=) p.resource;
    IF bound IS NOT NULL AND COALESCE(claim.issuer, '') OPERATOR(pg_catalog.<>) ''
       AND claim.issuer OPERATOR(pg_catalog.<>) bound THEN
        RAISE EXCEPTION USING ERRCODE = 'YF007',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: resource %L takes tokens from '
                                        'issuer %L, not %L', claim.tbl, p.resource, bound,
                                        claim.issuer),
            DETAIL = pg_catalog.json_build_object(
                'reason', 'issuer_mismatch', 'table', claim.tbl::text, 'resource', p.resource,
                'token', claim.token, 'issuer', claim.issuer, 'expected_issuer', bound)::text;
    END IF;
    old := fencekit.current_fence(p.resource, k);
    SELECT * INTO bad FROM fencekit.advance_fences(p.resource, ARRAY[k], claim.token, 'accept');
    IF bad.bad_reason OPERATOR(pg_catalog.=) 'stale' THEN
        RAISE EXCEPTION USING ERRCODE = 'YF001',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: token %s is lower than the fence %s '
                                        'of resource %L key %L', claim.tbl, claim.token,
                                        bad.bad_fence, p.resource, k),
            DETAIL = pg_catalog.json_build_object(
                'reason', 'stale', 'table', claim.tbl::text, 'resource', p.resource,
                'key', k, 'token', claim.token, 'fence', bad.bad_fence)::text,
            HINT = 'A newer holder has claimed or written this resource: the lease is superseded.';
    ELSIF bad.bad_reason IS NOT NULL AND bad.bad_reason OPERATOR(pg_catalog.<>) 'reused' THEN
        RAISE EXCEPTION USING ERRCODE = 'YF000',
            MESSAGE = pg_catalog.format('fencekit.claim on %s: %s', claim.tbl, bad.bad_reason);
    END IF;
    RETURN old;
END;
$fn$;

COMMENT ON FUNCTION fencekit.claim(regclass, text[], bigint, text) IS
    'fencekit: raise a key or table fence to a new lease''s token at grant (older tokens are '
    'stale from then on); needs write privilege on the table.';

REVOKE ALL ON FUNCTION fencekit.claim(regclass, text[], bigint, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fencekit.claim(regclass, text[], bigint, text) TO PUBLIC;
