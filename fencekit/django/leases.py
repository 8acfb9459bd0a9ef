"""Leases for a Django project, from its ``DATABASES``: no DSN assembled by hand.

    from fencekit.django.leases import lease

    with lease("billing:42", ttl=30, wait=10):   # fencekit's issuer, in the 'default' database
        Summary.objects.update_or_create(...)    # the app sends the lease's token

``issuer(using)`` is a :class:`~fencekit.leases.PostgresIssuer` connected as Django's connection
``using`` connects (its NAME, USER, PASSWORD, HOST, PORT and the libpq keys of its OPTIONS);
``lease(resource, using=..., **kwargs)`` opens one and holds a :class:`~fencekit.leases.Lease`
on it for a ``with`` block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from fencekit.leases import Lease, PostgresIssuer

__all__ = ["conninfo", "issuer", "lease"]


def _libpq_keywords() -> frozenset[str]:
    from psycopg import pq

    return frozenset(d.keyword.decode() for d in pq.Conninfo.get_defaults())


def conninfo(using: str = DEFAULT_DB_ALIAS) -> str:
    """A libpq connection string for Django's database ``using``, as its backend connects.

    Built from the backend's own connection parameters, keeping what libpq understands
    (psycopg-only options such as a cursor factory or server-side binding are left out)."""
    from psycopg.conninfo import make_conninfo

    wrapper = connections[using]
    if wrapper.vendor != "postgresql":
        raise ValueError(
            f"DATABASES[{using!r}] uses the {wrapper.vendor!r} backend; fencekit's issuer "
            "lives in PostgreSQL (ENGINE 'django.db.backends.postgresql')"
        )
    keywords = _libpq_keywords()
    params = {
        key: value
        for key, value in wrapper.get_connection_params().items()
        if key in keywords and isinstance(value, (str, int)) and value != ""
    }
    return make_conninfo("", **params)


def issuer(using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> PostgresIssuer:
    """fencekit's built-in issuer in Django's database ``using``; ``kwargs`` go to
    :class:`~fencekit.leases.PostgresIssuer` (``timeout``, psycopg connect options)."""
    return PostgresIssuer(conninfo(using), **kwargs)


@contextlib.contextmanager
def lease(resource: str, *, using: str = DEFAULT_DB_ALIAS, **kwargs: Any) -> Iterator[Lease]:
    """Hold the lease on ``resource`` from the issuer in Django's database ``using`` for the
    block; ``kwargs`` go to :class:`~fencekit.leases.Lease` (``ttl``, ``wait``, ``holder``,
    ``on_lost``...). Inside it the lease's token is current (``fencing``), so every write the
    fencekit app sends carries it."""
    with issuer(using) as iss, Lease(iss, resource, **kwargs) as held:
        yield held
