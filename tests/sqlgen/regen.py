"""Rewrite tests/sqlgen/golden/*.sql from the generator: ``python -m tests.sqlgen.regen``."""

from __future__ import annotations

from tests.sqlgen.golden_specs import GOLDEN, SPECS, path, render


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    for stale in GOLDEN.glob("*.sql"):
        if stale.stem not in SPECS:
            stale.unlink()
            print(f"removed {stale}")
    for name in SPECS:
        target = path(name)
        text = render(name)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target}")


if __name__ == "__main__":
    main()
