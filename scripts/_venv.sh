# Sourced by scripts/test and scripts/demo: make .venv and install the project into it.
# Usage: ensure_venv WHAT   (test: the development setup; or an extra, e.g. embedded)
# test installs pg-fencekit with every extra and pytest-fencekit (both editable) and the `dev`
# dependency group (PEP 735: the test and lint tools, never a published extra); pip >= 25.1
# reads groups, so pip is upgraded first. An extra alone gets psycopg[binary] beside it (the
# library depends on plain psycopg: the application picks the implementation).
# Reinstalls only when a pyproject.toml changed since the last install of that setup.

ensure_venv() {
    local extra="$1"
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local venv="$root/.venv"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    if [ ! -x "$venv/bin/python" ]; then
        echo "==> creating $venv"
        python3 -m venv "$venv"
    fi
    local stamp="$venv/.fencekit-installed-$extra"
    local want
    want="$(cat "$root/pyproject.toml" "$root/pytest-fencekit/pyproject.toml" | sha256sum | cut -d' ' -f1)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        "$venv/bin/python" -m pip install --quiet --upgrade "pip>=25.1"
        if [ "$extra" = "test" ]; then
            local extras="all,etcd,zookeeper,psycopg2,asyncpg,embedded,chaos,django,testing"
            echo "==> pip install -e '.[$extras]' -e ./pytest-fencekit --group dev"
            "$venv/bin/python" -m pip install --quiet -e "$root[$extras]" \
                -e "$root/pytest-fencekit" --group "$root/pyproject.toml:dev"
        else
            echo "==> pip install -e '.[$extra]' 'psycopg[binary]'"
            "$venv/bin/python" -m pip install --quiet -e "$root[$extra]" "psycopg[binary]"
        fi
        echo "$want" > "$stamp"
    fi
    export PATH="$venv/bin:$PATH"
}

# Usage: ensure_lowest_psycopg   (after ensure_venv; sets LOWEST_PSYCOPG and LOWEST_PSYCOPG_DIR)
# The lowest psycopg that pyproject.toml declares, installed once (no dependencies: the venv's
# serve) into .cache/psycopg-lowest/<version>, for scripts/test's second adapter run on
# PYTHONPATH. The pure-Python implementation over the system's libpq: psycopg-binary's oldest
# releases have no wheel for newer Pythons (3.1.0's stop at 3.10), and the Python code that
# fencekit reads (its transactions and connections) is the same in both implementations.
ensure_lowest_psycopg() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    # The library's own dependency line, "psycopg>=X" (the dev group's psycopg[binary] follows it).
    LOWEST_PSYCOPG="$(sed -nE 's/^ *"psycopg>=([0-9.]+)",?( *#.*)?$/\1/p' "$root/pyproject.toml")"
    if [ -z "$LOWEST_PSYCOPG" ]; then
        echo "pyproject.toml: no \"psycopg>=X\" dependency line found" >&2
        return 1
    fi
    LOWEST_PSYCOPG_DIR="$root/.cache/psycopg-lowest/$LOWEST_PSYCOPG"
    if [ ! -f "$LOWEST_PSYCOPG_DIR/.installed" ]; then
        echo "==> pip install --target $LOWEST_PSYCOPG_DIR psycopg==$LOWEST_PSYCOPG"
        rm -rf "$LOWEST_PSYCOPG_DIR"
        python -m pip install --quiet --no-deps --target "$LOWEST_PSYCOPG_DIR" \
            "psycopg==$LOWEST_PSYCOPG"
        touch "$LOWEST_PSYCOPG_DIR/.installed"
    fi
}

# Usage: test_lowest_psycopg   (after ensure_venv)
# The adapter tests that exercise psycopg internals (tests/adapters/test_begin.py and
# test_psycopg.py), on the lowest declared psycopg; fails when they fail. FENCEKIT_EXPECT_PSYCOPG
# makes a test check that the run imported that version, and the first line says what it tested.
# On its own: bash -c 'source scripts/_venv.sh && ensure_venv test && test_lowest_psycopg'
test_lowest_psycopg() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    ensure_lowest_psycopg || return 1
    echo "==> pytest on the lowest declared psycopg ($LOWEST_PSYCOPG)"
    (
        cd "$root"
        export PYTHONPATH="$LOWEST_PSYCOPG_DIR" PSYCOPG_IMPL=python
        export FENCEKIT_EXPECT_PSYCOPG="$LOWEST_PSYCOPG"
        python - <<'PY' || exit 1
import psycopg

libpq = psycopg.pq.version()
print(
    f"    psycopg {psycopg.__version__} ({psycopg.pq.__impl__} implementation, "
    f"libpq {libpq // 10000}.{libpq % 10000}) from {psycopg.__file__}"
)
PY
        python -m pytest -q tests/adapters/test_begin.py tests/adapters/test_psycopg.py \
            tests/adapters/test_wire.py
    )
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "==> FAILED: adapter tests on psycopg $LOWEST_PSYCOPG, the lowest pyproject.toml declares" >&2
        return "$rc"
    fi
    echo "==> adapter tests passed on psycopg $LOWEST_PSYCOPG, the lowest pyproject.toml declares"
}
