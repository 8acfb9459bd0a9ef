-- Code on protected tables that a DBA has reviewed (`fencekit allow`): `fencekit status`
-- reports every trigger, default, constraint, policy, rule or type on a protected table that
-- runs code fencekit did not generate, and stops reporting one whose code hash is listed here.
-- The hash pins the code itself (a trigger's function body, language, arguments, security
-- mode; an expression's text), not an object's name: a trigger renamed or re-created under a
-- new version's name stays allowed while its code is unchanged, and a changed body is
-- reported again. Written by fencekit_admin only: a table owner cannot allow its own code.
CREATE TABLE IF NOT EXISTS fencekit.allowed_code (
  sha256      text PRIMARY KEY CHECK (sha256 OPERATOR(pg_catalog.~) '^[0-9a-f]{64}$'),
  object      text NOT NULL,
  note        text,
  allowed_by  text NOT NULL DEFAULT current_user,
  allowed_at  timestamptz NOT NULL DEFAULT pg_catalog.now()
);

REVOKE ALL ON fencekit.allowed_code FROM PUBLIC;
GRANT SELECT ON fencekit.allowed_code TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON fencekit.allowed_code TO fencekit_admin;
