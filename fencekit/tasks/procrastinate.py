"""procrastinate: a connector whose pooled connections carry the fencing token.

procrastinate runs every query (its own and the ones a task sends through ``app.connector``)
on a connection taken from its psycopg pool, in autocommit, and has no hook for a token. The
pool does have one for new connections (``configure``): :func:`fenced_connector` installs
fencekit's psycopg adapter there, so a query sent inside a ``fencing()`` scope (a
:func:`fencekit.tasks.fenced_task` body) carries the scope's token, and one sent outside carries
none. It is procrastinate's ``PsycopgConnector``, nothing else changed::

    app = procrastinate.App(connector=fenced_connector(conninfo=DSN))

    @app.task(name="recompute")
    @fenced_task(issuer, "billing:{account_id}", ttl=30, claim=claim_account)
    async def recompute(account_id: int) -> None:
        await app.connector.execute_query_async("UPDATE billing_summary ...")

The same keyword arguments serve procrastinate's synchronous connector (``defer`` outside an
event loop, ``apply_schema``), whose pool calls ``configure`` without awaiting it.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from procrastinate import PsycopgConnector

from fencekit.psycopg import install

__all__ = ["fenced_connector"]


class _Done:
    """Awaitable that is already done: the async pool awaits ``configure``, the sync one does
    not (a coroutine would be left unawaited there)."""

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


def fenced_connector(**kwargs: Any) -> PsycopgConnector:
    """procrastinate's ``PsycopgConnector(**kwargs)``, its connections fenced (see above).

    A ``configure`` of your own (sync, or async for the async pool) runs first.
    """
    own: Callable[[Any], Any] | None = kwargs.pop("configure", None)

    def configure(conn: Any) -> Any:
        done = own(conn) if own is not None else None
        install(conn)
        if done is None:
            return _Done()

        async def after_own() -> None:
            await done

        return after_own()

    return PsycopgConnector(configure=configure, **kwargs)
