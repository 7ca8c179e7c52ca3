#!/usr/bin/env bash
# The README's main command: installs what is missing, builds the host libraries,
# runs every variant on a BERT-base layer, checks each against the reference and
# prints the comparison. Extra arguments go to `attn bench` (e.g. --repetitions 50).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tools/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release --target attn_cli
./build/release/cli/attn bench "$@"
