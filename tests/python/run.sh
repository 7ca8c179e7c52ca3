#!/usr/bin/env bash
# ctest's python.pytest: the Python package's tests (tests/python) against the package as
# built (<build>/python), with the interpreter of .venv-python (tools/python-requirements.txt:
# torch, transformers, the MiniLM checkpoint), which tools/test.sh installs.
#   run.sh <source dir> <build package dir> <Python version the module was built for>
set -euo pipefail
source_dir="$1" package_dir="$2" built_for="$3"
python="$source_dir/.venv-python/bin/python"
if [[ ! -x "$python" ]]; then
  echo "SKIPPED: no $python: tools/test.sh installs tools/python-requirements.txt there when PyPI is reachable"
  exit 77
fi
version="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
if [[ "$version" != "$built_for" ]]; then
  echo "python.pytest: .venv-python is Python $version, but the extension was built for $built_for:" \
       "remove .venv-python and run tools/test.sh again" >&2
  exit 1
fi
export PYTHONPATH="$package_dir:$source_dir/tests/python" PYTHONDONTWRITEBYTECODE=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_VERBOSITY=error TOKENIZERS_PARALLELISM=false OMP_WAIT_POLICY=PASSIVE
exec "$python" -m pytest -p no:cacheprovider -q "$source_dir/tests/python"
