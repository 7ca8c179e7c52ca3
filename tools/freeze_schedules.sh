#!/usr/bin/env bash
# Regenerates the checked-in autoscheduled schedules (generated/frozen/) from the
# generators: builds the generator executable, runs each autoscheduler plugin per
# ISA and AOT function, rewrites generated/frozen/registry.inc. Arguments go to
# tools/freeze_schedules.py (--sources, --isas, --functions, --jobs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target attn_generators
plugins="$(halide_library_dir)"
python3 tools/freeze_schedules.py --generator build/release/attn_generators --plugins "$plugins" "$@"
