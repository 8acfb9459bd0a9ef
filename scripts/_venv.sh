# Sourced by scripts/test and scripts/demo: make .venv and install the project into it.
# Usage: ensure_venv EXTRA   (e.g. test, embedded)
# Reinstalls only when pyproject.toml changed since the last install of that extra.

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
    want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        echo "==> pip install -e '.[$extra]'"
        "$venv/bin/python" -m pip install --quiet --upgrade pip
        "$venv/bin/python" -m pip install --quiet -e "$root[$extra]"
        echo "$want" > "$stamp"
    fi
    export PATH="$venv/bin:$PATH"
}
