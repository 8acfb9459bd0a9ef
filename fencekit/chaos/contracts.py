"""What each issuer promises about its leases, and which clock each promise depends on.

The lease-safety check allows an overlap of two grants in real time only where the issuer's
own contract allows it; these are the contracts it applies (docs/chaos.md repeats them).
Whatever the clocks do, tokens must stay unique and increasing and the fence must hold: that
part depends on no clock at all.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLOCK_NOTE", "IssuerContract", "contract_for"]


@dataclass(frozen=True)
class IssuerContract:
    issuer: str
    #: what "exclusive" means for this issuer, in one sentence
    exclusion: str
    #: where the tokens come from and why they never repeat (no clock involved)
    tokens: str
    #: which processes' clocks (as named in ``clock`` history events) the exclusion depends
    #: on: an overlap while one of them is faulted is allowed by the contract
    clocks: tuple[str, ...]
    #: a member of the issuer's cluster paused (SIGSTOP) counts as a fault of the issuer's
    #: clock, from the pause until a second after it resumes (see :func:`etcd_revokes_early`)
    member_pause_is_clock_fault: bool = False


CONTRACTS: dict[str, IssuerContract] = {
    "postgres": IssuerContract(
        "postgres",
        "a lease is exclusive until ttl seconds after the grant or renewal that the server "
        "processed last, counted on the PostgreSQL server's clock (clock_timestamp()); a server "
        "clock stepped forward or running fast ends it early in real time",
        "a sequence in fencekit.leases: unique and increasing whatever the clocks",
        ("server",),
    ),
    "etcd": IssuerContract(
        "etcd",
        "a lease is exclusive until its TTL runs out on the Raft leader's monotonic clock; a "
        "new leader restarts the remaining TTLs at full length (longer, never shorter)",
        "the lock key's create revision: etcd's cluster-wide revision, assigned in log order",
        ("etcd",),
    ),
    "zookeeper": IssuerContract(
        "zookeeper",
        "a lease is exclusive until the holder's session expires, counted by the leader from "
        "the last time it heard from the session; a new leader restarts the session timers",
        "the lock node's czxid: epoch << 32 | counter, assigned by the leader in write order",
        ("zookeeper",),
    ),
}


#: etcd releases with the fix for etcd-io/etcd#15247 ("ignore old leader's leases revoking
#: request"), per minor version; minor versions after the last listed all have it.
_ETCD_FIXED = {(3, 4): 31, (3, 5): 13}


def etcd_revokes_early(version: str | None) -> bool:
    """Does this etcd server version let a deposed leader revoke leases early?

    A leader stopped longer than a lease's TTL (a pause, a stall on fsync) counts that time on
    its own clock: when it runs again, before it learns that another member was elected, it
    finds the lease expired and proposes its revocation, which the new leader applies, ending
    the lease before its TTL ran out on the new leader's clock (etcd-io/etcd#15247, fixed in
    3.4.31 and 3.5.13). Unknown versions are held to the fixed contract.
    """
    if not version:
        return False
    try:
        major, minor, patch = (int(x) for x in version.split("-", 1)[0].split(".")[:3])
    except ValueError:
        return False
    if (major, minor) in _ETCD_FIXED:
        return patch < _ETCD_FIXED[(major, minor)]
    return (major, minor) < min(_ETCD_FIXED)


#: The issuer's contract for a name (and server version, where the contract depends on it),
#: or the strictest one (no overlap, no clock) when unknown: a history from someone else's
#: system is checked against plain mutual exclusion.
def contract_for(issuer: str | None, version: str | None = None) -> IssuerContract:
    if issuer == "etcd" and etcd_revokes_early(version):
        etcd = CONTRACTS["etcd"]
        return IssuerContract(
            "etcd",
            f"{etcd.exclusion}; but in etcd {version} (before 3.4.31 / 3.5.13) a leader paused "
            "past a lease's TTL may revoke it on resuming, before it learns it was deposed "
            "(etcd-io/etcd#15247): a paused member counts as a fault of etcd's clock",
            etcd.tokens,
            etcd.clocks,
            member_pause_is_clock_fault=True,
        )
    if issuer in CONTRACTS:
        return CONTRACTS[issuer]
    return IssuerContract(
        issuer or "unknown",
        "no two grants of a resource overlap in real time",
        "unique and increasing per resource",
        (),
    )


CLOCK_NOTE = (
    "what depends on clocks: nothing in the fence (token order, stale and unfenced writes "
    "rejected: no clock is read); lease exclusion depends on the issuer's clock (PostgreSQL "
    "server: clock_timestamp(); etcd/ZooKeeper: the leader's); a holder's own 'lost' signal "
    "depends on the issuer's clock (renew answering False) and on the holder's monotonic clock "
    "(Lease.is_lost), so a paused or clock-skewed holder learns late, and only the fence stops it"
)
