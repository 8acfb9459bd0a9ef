# Sourced by scripts/test: Patroni for the HA tests (tests/ha) and `python -m tests.lab ha`.
# Usage: ensure_patroni   (sets FENCEKIT_PATRONI to the patroni program)
# A virtualenv of Debian's own Python (/usr/bin/python3), cached in .cache/patroni/venv-<v>:
# Patroni runs as the postgres OS user (PostgreSQL refuses root), which must be able to read
# its interpreter; an interpreter installed in root's home (pyenv) is not readable there.
# Built once per version; a failed build leaves nothing half-made behind.

PATRONI_VERSION=4.1.5

ensure_patroni() {
    local root
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    local venv="$root/.cache/patroni/venv-$PATRONI_VERSION"
    if [ ! -f "$venv/.installed" ]; then
        if [ ! -x /usr/bin/python3 ]; then
            echo "==> note: /usr/bin/python3 missing: the HA tests skip (apt-get install python3-venv)"
            return 0
        fi
        echo "==> patroni $PATRONI_VERSION into $venv (Debian's /usr/bin/python3)"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        if ! /usr/bin/python3 -m venv "$venv" \
            || ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
                "patroni[etcd3,psycopg3]==$PATRONI_VERSION"; then
            echo "==> note: could not build Patroni's virtualenv: the HA tests skip" >&2
            rm -rf "$venv"
            return 0
        fi
        touch "$venv/.installed"
    fi
    export FENCEKIT_PATRONI="$venv/bin/patroni"
}
