// --serve: the measuring side of the interleaved comparison (bench/compare.py). Reads
// one command per line on stdin and answers each with one JSON line on stdout:
//   list                  {"context", "problems", "cases": [{"name", "function", "problem", "gflop", "gbyte"}]}
//                         (gflop, gbyte: the case's work, cases.h; tools/gpu_kernels.py reads it too)
//   prepare <case>        makes the case ready (first run, checked against the reference, and the
//                         peak heap of a second run): {"name", "ok", "error", "max_error", "peak_bytes"}
//   time <case> <seconds> runs a prepared case for at least that long (at least once):
//                         {"ms": per-run wall time, "runs": n}
//   release               forgets every prepared case and problem fixture
// A malformed command is answered {"error": ...}; end of input ends the process.
#pragma once

#include "cases.h"

#include <nlohmann/json.hpp>

namespace attn::bench {

int serve(const std::vector<Case> &cases);

// The machine and libraries the cases run on (for the report, and Google Benchmark's context).
nlohmann::json context_json();

}  // namespace attn::bench
