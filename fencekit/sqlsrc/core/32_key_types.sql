-- ------------------------------------------------------------------ key column types

-- Refuses (YF000) unless every key column of a key-fenced table still has a type whose text
-- is computed by built-in code only, and of the family protect recorded (fencekit.protected.
-- key_families). The key fence's SECURITY DEFINER trigger functions (fencekit/sqlgen/key.py)
-- make the same check before they compute a key's text with a cast (k::text): for key columns
-- of built-in types, one catalog read of their own, with no call; they call this function when
-- that read does not settle it (a domain, a change, a column gone). Their fast path casts
-- nothing (it prints keys of a few built-in types with their output functions) and takes
-- that check for any other type. `fencekit move` calls it before it computes an old key's
-- text. The table's owner may retype a key column after
-- protect (ALTER COLUMN ... TYPE, or DROP COLUMN and ADD COLUMN again) to a type of its own
-- whose cast to text is its own code, which must never run with the rights of the role that
-- ran protect. PL/pgSQL plans a
-- statement when it first runs it, so no cast is even looked up before this check returns.
--
-- `tag` names the registry row (the key columns and their families); `relid` is the table the
-- trigger fired on (a partition or child of the protected table has the same key columns).
-- Runs as its caller, reads only the catalogs and fencekit.protected, and evaluates nothing of
-- the table's: no cast, no input or output function, no operator of a user type. Index
-- lookups (the registry row by its tag, each key column's type and the type under one domain)
-- decide a key column of a built-in type, or of a domain over one, whose
-- family it names as fencekit.key_family does; anything else (nested domains,
-- collations other than the built-in deterministic ones, a change) takes the slow path below,
-- which calls fencekit.key_family itself and raises for what it refuses.
CREATE OR REPLACE FUNCTION fencekit.check_key_types(tag text, relid regclass) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  p record;
  c record;
  base oid;
  under oid;
  cols text[];
  now_family text;
  keys jsonb;
  families text[];
  fast boolean;
  typ oid;
  typmod integer;
  coll oid;
  generated "char";
  kind "char";
  dmod integer;
BEGIN
  -- The fast path: simple statements (index lookups and expressions, plans cached).
  SELECT pr.spec -> 'key', pr.key_families INTO keys, families
    FROM fencekit.protected pr WHERE pr.tag = check_key_types.tag;
  IF families IS NOT NULL THEN
    fast := true;
    FOR i IN 1 .. pg_catalog.jsonb_array_length(keys) LOOP
      SELECT a.atttypid, a.atttypmod, a.attcollation, a.attgenerated, t.typtype,
             t.typbasetype, t.typtypmod
        INTO typ, typmod, coll, generated, kind, under, dmod
        FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
       WHERE a.attrelid = relid AND a.attname = keys ->> (i - 1) AND a.attnum > 0
         AND NOT a.attisdropped;
      IF kind = 'd' THEN  -- one domain over a built-in type; deeper ones take the slow path
        typ := under;
        typmod := CASE WHEN dmod <> -1 THEN dmod ELSE typmod END;
        SELECT t.typtype INTO kind FROM pg_catalog.pg_type t WHERE t.oid = typ;
      END IF;
      IF typ IS NULL OR typ >= 16384 OR kind = 'd' OR generated = 'v'
         OR coll NOT IN (0, 100, 950, 951)  -- none, default, "C", "POSIX": deterministic
         OR families[i] IS DISTINCT FROM (CASE
              WHEN typ IN ('int2'::regtype, 'int4'::regtype, 'int8'::regtype) THEN 'integer'
              WHEN typ = 'text'::regtype OR (typ = 'varchar'::regtype AND typmod < 0)
                THEN 'text'
              WHEN typ = 'varchar'::regtype THEN pg_catalog.format_type(typ, typmod)
              WHEN typ = 'bpchar'::regtype THEN 'character'
              WHEN typ = 'numeric'::regtype AND typmod >= 4
                THEN 'numeric scale ' || ((typmod - 4) & 65535)
              WHEN typ IN ('uuid'::regtype, 'bool'::regtype, 'date'::regtype, 'bytea'::regtype)
                THEN pg_catalog.format_type(typ, NULL)
              WHEN typ IN ('time'::regtype, 'timestamp'::regtype, 'timestamptz'::regtype)
                THEN pg_catalog.format_type(typ, NULLIF(typmod, 6))
            END) THEN
        fast := false;
        EXIT;
      END IF;
    END LOOP;
    IF fast THEN
      RETURN;  -- every key column's type names its keys as it did at protect
    END IF;
  END IF;
  -- The slow path: say what is wrong, or find that nothing is (nested domains and the like).
  SELECT pr.spec -> 'key' AS key, pr.key_families INTO p
    FROM fencekit.protected pr WHERE pr.tag = check_key_types.tag;
  IF NOT FOUND OR pg_catalog.jsonb_typeof(p.key) IS DISTINCT FROM 'array' THEN
    RAISE EXCEPTION USING ERRCODE = 'YF000',
      MESSAGE = pg_catalog.format('fencekit: %s has the key fence triggers of %L, which '
                                  'fencekit.protected does not list as a key fence: no key is '
                                  'named', relid, tag),
      HINT = 'Re-protect the table (fencekit protect), or unprotect it (fencekit unprotect).';
  END IF;
  cols := ARRAY(SELECT pg_catalog.jsonb_array_elements_text(p.key));
  FOR c IN SELECT u.col, u.o, a.atttypid, a.atttypmod
             FROM pg_catalog.unnest(cols) WITH ORDINALITY AS u(col, o)
             LEFT JOIN pg_catalog.pg_attribute a
               ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                  AND NOT a.attisdropped
            ORDER BY u.o LOOP
    base := c.atttypid;
    LOOP  -- a domain's text is its base type's (a cast from a domain is never used)
      SELECT t.typbasetype INTO under FROM pg_catalog.pg_type t
       WHERE t.oid = base AND t.typtype = 'd';
      EXIT WHEN NOT FOUND;
      base := under;
    END LOOP;
    -- Below FirstNormalObjectId: built in (its cast to text, output function and, for an
    -- array or a composite, its elements' are pg_catalog's, which only a superuser changes).
    IF c.atttypid IS NULL OR base >= 16384 THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I of %s has type %s, but the table '
                                    'was protected with a key of %s: no key text is computed '
                                    'from it', c.col, relid,
                                    COALESCE(pg_catalog.format_type(c.atttypid, c.atttypmod),
                                             '(no such column)'),
                                    COALESCE(p.key_families[c.o], 'a built-in type')),
        HINT = 'Restore the column''s type, or re-protect the table: unprotect it and protect '
               'it again (fencekit unprotect, fencekit protect; its fences restart).',
        COLUMN = c.col;
    END IF;
  END LOOP;
  IF p.key_families IS NULL THEN
    RETURN;  -- protected before the families were recorded: built-in types are all we know
  END IF;
  FOR c IN SELECT u.col, u.o, a.atttypid, a.atttypmod
             FROM pg_catalog.unnest(cols) WITH ORDINALITY AS u(col, o)
             JOIN pg_catalog.pg_attribute a
               ON a.attrelid = relid AND a.attname = u.col AND a.attnum > 0
                  AND NOT a.attisdropped
            ORDER BY u.o LOOP
    -- Raises itself for a built-in type that cannot be a key (float8, a nondeterministic
    -- collation ...).
    now_family := fencekit.key_family(relid, c.col);
    IF now_family IS DISTINCT FROM p.key_families[c.o] THEN
      RAISE EXCEPTION USING ERRCODE = 'YF000',
        MESSAGE = pg_catalog.format('fencekit: key column %I of %s has type %s, but the table '
                                    'was protected with a key of %s: no key text is computed '
                                    'from it', c.col, relid,
                                    pg_catalog.format_type(c.atttypid, c.atttypmod),
                                    p.key_families[c.o]),
        HINT = 'Restore the column''s type, or re-protect the table: unprotect it and protect '
               'it again (fencekit unprotect, fencekit protect; its fences restart).',
        COLUMN = c.col;
    END IF;
  END LOOP;
END
$fn$;
