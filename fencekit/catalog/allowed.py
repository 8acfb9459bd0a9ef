"""The allow-list of reviewed code: hashes a DBA recorded in ``fencekit.allowed_code``
(writable by fencekit_admin only). Code whose hash is listed is not drift."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from fencekit.catalog.model import Conn, Status, iso
from fencekit.errors import CatalogError

__all__ = ["allow_code", "allowed_code", "allowed_hashes", "revoke_code"]


def allowed_hashes(conn: Conn) -> frozenset[str]:
    """The code hashes in ``fencekit.allowed_code`` (empty on a core that predates it)."""
    if conn.execute("SELECT pg_catalog.to_regclass('fencekit.allowed_code')").fetchone() == (None,):
        return frozenset()
    return frozenset(str(r[0]) for r in conn.execute("SELECT sha256 FROM fencekit.allowed_code"))


def allowed_code(conn: Conn) -> list[dict[str, Any]]:
    """The rows of fencekit.allowed_code, oldest first."""
    return [
        {"sha256": sha, "object": obj, "note": note, "allowed_by": by, "allowed_at": iso(at)}
        for sha, obj, note, by, at in conn.execute(
            "SELECT sha256, object, note, allowed_by, allowed_at FROM fencekit.allowed_code "
            "ORDER BY allowed_at, sha256"
        ).fetchall()
    ]


def allow_code(conn: Conn, st: Status, hashes: Collection[str], note: str | None) -> dict[str, str]:
    """Record reviewed code hashes (each must be one ``st``, a status of this database just
    taken, reports); returns hash -> the object it was reported on. Only members of
    fencekit_admin may write the table."""
    reported: dict[str, str] = {}
    for d in st.all_drift():
        if d.sha256 is not None:
            reported.setdefault(d.sha256, d.object)
    unknown = [h for h in hashes if h not in reported]
    if unknown:
        raise CatalogError(
            f"no code status reports has the hash {', '.join(unknown)} (allowed already, or "
            "changed since status printed it?)"
        )
    with conn.transaction():
        for h in hashes:
            conn.execute(
                "INSERT INTO fencekit.allowed_code (sha256, object, note) VALUES (%s, %s, %s) "
                "ON CONFLICT (sha256) DO UPDATE SET object = excluded.object, "
                "note = excluded.note, allowed_by = excluded.allowed_by, "
                "allowed_at = excluded.allowed_at",
                (h, reported[h], note),
            )
    return {h: reported[h] for h in hashes}


def revoke_code(conn: Conn, hashes: Collection[str]) -> list[str]:
    """Remove hashes from fencekit.allowed_code; returns those that were there."""
    rows = conn.execute(
        "DELETE FROM fencekit.allowed_code WHERE sha256 = ANY(%s) RETURNING sha256",
        (list(hashes),),
    ).fetchall()
    return sorted(str(r[0]) for r in rows)
