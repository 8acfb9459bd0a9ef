# Sourced by scripts/test: the Debian packages the suite's servers come from.
# PostgreSQL 15 (second server for all_servers tests) and its plpgsql_check (the PL/pgSQL lint:
# tests/security/test_plpgsql_check.py), pgbouncer (transaction pooling tests),
# etcd and ZooKeeper (issuer tests), faketime (libfaketime: chaos clock faults), python3-venv
# (Patroni's virtualenv of Debian's Python for tests/ha: scripts/_patroni.sh), redis-server (the
# Celery and dramatiq broker of tests/tasks), chromium (tests/chaos loads the chaos report in
# headless Chromium). Installs only
# what is missing, and only as root with apt; otherwise it says what is missing (those tests then skip, or fail when CI=true).

ensure_system_packages() {
    local packages=(postgresql-15 postgresql-15-plpgsql-check pgbouncer etcd-server etcd-client
        zookeeper faketime python3-venv redis-server chromium)
    local missing=()
    local pkg
    for pkg in "${packages[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "==> apt-get install ${missing[*]}"
            export DEBIAN_FRONTEND=noninteractive
            apt-get update -qq
            # Say what the install will do before it does it: a dependency can pull an installed
            # package to a newer release (plpgsql-check once took postgresql-15 from 15.18 to
            # 15.20), and a server someone started by hand from the old binaries then fails until
            # it is restarted. The suite's own servers all start after this step.
            local plan
            plan="$(apt-get -s install --no-install-recommends "${missing[@]}" 2>/dev/null \
                | sed -nE 's/^Inst ([^ ]+) \[([^]]+)\] \(([^ ]+).*/    upgrades \1 \2 -> \3/p;
                            s/^Inst ([^ ]+) \(([^ ]+).*/    installs \1 \2/p')"
            [ -n "$plan" ] && printf '%s\n' "$plan"
            if printf '%s\n' "$plan" | grep -qE '^    upgrades (postgresql|pgbouncer|etcd|zookeeper|redis)'; then
                echo "==> note: this upgrades a server package: a cluster you started by hand from it"
                echo "    keeps the old binary loaded and fails (e.g. 'undefined symbol') until restarted"
            fi
            apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confold \
                "${missing[@]}" >/dev/null
        else
            echo "==> note: missing Debian packages (${missing[*]}); as root: apt-get install ${missing[*]}"
        fi
    fi
    # The versions this run tests with (docs/testing.md states the tested ranges).
    echo "==> Debian packages the suite uses"
    dpkg-query -W -f='    ${Package} ${Version}\n' "${packages[@]}" 2>/dev/null || true
}
