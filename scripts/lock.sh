#!/usr/bin/env bash
# The lock of the active environment, on stdout, in the format of constraints.txt:
#   bash scripts/lock.sh > constraints.txt
# Every installed package pinned (interp-seal itself, installed editable, left out), with
# local build labels dropped (torch 2.13.0+cpu -> 2.13.0) so one file serves the CPU and the
# CUDA build of a release. torch's CUDA runtime packages (nvidia-*, cuda-*, triton) are left
# out too: which of them a machine needs depends on the torch build it installs, not on us.
set -euo pipefail
echo "# The tested set: every package the tests import and what they pull in, at the versions"
echo "# of the last green run (README: Development). Written by scripts/lock.sh on $(date -u +%Y-%m-%d),"
echo "# Python $(python -c 'import platform; print(platform.python_version())')."
pip freeze --exclude-editable |
  sed -E 's/^([^=]+==[^+]+)\+.*$/\1/' |
  grep -viE '^(nvidia-|cuda-|triton==|interp-seal)' |
  sort -f
