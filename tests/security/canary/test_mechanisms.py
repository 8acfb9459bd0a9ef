"""The canary matrix plants every mechanism docs/dev/code-paths.md names, and each planted
canary really runs (as the writer or the owner) when a writer writes and the owner
maintains its tables: a planter that never fires would prove nothing."""

from __future__ import annotations

import psycopg

from tests.security.canary import _plant
from tests.security.canary._cells import fired
from tests.security.canary.conftest import FRESH, Planted

#: The writer's own statements, and the owner's maintenance: between them every mechanism runs.
WRITER = [
    "INSERT INTO app.t_row (id) VALUES (100)",
    "INSERT INTO app.t_key (id, k) VALUES (100, 7)",
    "INSERT INTO app.p_row (id) VALUES (100)",
    "UPDATE app.t_row SET v = v + 1 WHERE id = 1",
    "UPDATE app.t_key SET v = v + 1, c_default = DEFAULT WHERE id = 1",
    "DELETE FROM app.t_row WHERE id = 2",
    "DELETE FROM app.t_key WHERE id = 1",
    "SELECT max(v) FROM app.t_table WHERE id > 0",
    "SELECT c_mood::text, to_json(c_mood), t::text FROM app.t_row t",
    "SELECT '[1,2)'::app.r_in, '{[1,2)}'::app.r_mm, '(1)'::app.comp",
    "SELECT count(*) FROM app.t_row WHERE c_rdiff && app.r_diff(0, 10)",
    "INSERT INTO app.t_row_v (id) VALUES (101)",
    "SELECT count(*) FROM app.t_row_v",
    "UPDATE app.s_row SET v = v + 1 WHERE id = 1",
    "SELECT count(*) FROM app.s_row",
    "TRUNCATE app.t_table CASCADE",
]
OWNER = [
    "DO $$ DECLARE x app.d_var; BEGIN NULL; END $$",
    "SET search_path = public, pg_catalog",
    "SELECT max(x) FROM (VALUES ('a'::varchar)) v(x) WHERE lower(x::varchar) IS NOT NULL",
    "RESET search_path",
    "REFRESH MATERIALIZED VIEW app.t_row_mv",
    "ANALYZE app.t_row",
]


def test_the_page_names_only_planted_mechanisms_and_every_planter_is_on_the_page() -> None:
    page = _plant.page_mechanisms()
    assert len(page) >= 40, "docs/dev/code-paths.md: the Mechanisms table did not parse"
    missing = sorted(set(page) - _plant.planted_labels())
    assert not missing, (
        f"docs/dev/code-paths.md names mechanisms the canary matrix does not plant: {missing}; "
        "add a planter for each to tests/security/canary/_plant.py"
    )
    unlisted = sorted(_plant.planted_labels() - set(page))
    assert not unlisted, f"planters with no row in docs/dev/code-paths.md: {unlisted}"


def test_every_planted_canary_runs(planted: Planted) -> None:
    with planted.fresh() as db:
        before = planted.hits(db)
        with psycopg.connect(planted.dsn(db, planted.writer)) as w:
            for stmt in WRITER:
                with w.transaction():
                    w.execute("SELECT set_config('fencekit.token', %s, true)", (str(FRESH),))
                    try:
                        with w.transaction():
                            w.execute(stmt)
                    except psycopg.Error:
                        pass  # a refused write still ran what it ran before the refusal
        with psycopg.connect(planted.dsn(db, planted.owner), autocommit=True) as o:
            for stmt in OWNER:
                o.execute(stmt)
            # with-hold-cursor and the deferred ones run at the writer's COMMIT above
        after = planted.hits(db)
    # the rows planted on core are planted, and run, in test_core_planted.py
    table_rows = {m for m, on in _plant.page_mechanisms().items() if on != "core"}
    silent = sorted(table_rows - fired(before, after))
    assert not silent, f"planted canaries that never ran: {silent}"
