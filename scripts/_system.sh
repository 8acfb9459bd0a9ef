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
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "==> apt-get install ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends -o Dpkg::Options::=--force-confold \
            "${missing[@]}" >/dev/null
    else
        echo "==> note: missing Debian packages (${missing[*]}); as root: apt-get install ${missing[*]}"
    fi
}
