#include "serve.h"

#include "attn/internal.h"
#include "openblas_peers.h"
#include "peak_memory.h"

#include <cblas.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace attn::bench {

using testing::ListedProblem;
using testing::Problem;

namespace {

// The problem list, with each sequence's real length, for the Python side (bench/compare.py).
nlohmann::json problems_json() {
    nlohmann::json list = nlohmann::json::array();
    for (const ListedProblem &lp : testing::problem_list()) {
        const Problem &p = lp.problem;
        nlohmann::json lengths = nlohmann::json::array();
        for (int64_t real : lengths_of(p)) lengths.push_back(real);
        list.push_back({{"name", p.name()},
                        {"model", lp.model},
                        {"batch", p.batch},
                        {"s_q", p.s_q},
                        {"s_k", p.s_k},
                        {"hidden", p.hidden},
                        {"heads", p.heads},
                        {"causal", p.causal},
                        {"reference_checked", lp.reference_checked},
                        {"lengths", lengths},
                        {"gflop", work(kLayerFunction, p).flops * 1e-9}});
    }
    return list;
}

}  // namespace

nlohmann::json context_json() {
    return {{"cpu_model", attn::detail::cpu_model()},
            {"cpu_id", attn::detail::cpu_id()},
            {"num_cpus", std::thread::hardware_concurrency()},
            {"halide", "21.0.0"},
            {"openblas", openblas_get_config()},
            {"threads", num_threads()},
            {"openblas_threads", openblas_get_num_threads()},
            {"selected_variant", select_variant().name},
            {"selected_because", attn::default_variant_reason()}};
}

int serve(const std::vector<Case> &cases) {
    std::map<std::string, const Case *> by_name;
    for (const Case &c : cases) by_name[c.name] = &c;
    std::map<std::string, Prepared> prepared;
    PeakMemory peak_memory;
    auto reply = [](const nlohmann::json &answer) { std::cout << answer.dump() << std::endl; };
    for (std::string line; std::getline(std::cin, line);) {
        std::istringstream words(line);
        std::string command, name;
        words >> command >> name;
        try {
            if (command == "list") {
                nlohmann::json listed = nlohmann::json::array();
                for (const Case &c : cases) {
                    const Work w = work(c.function, c.problem->problem);
                    listed.push_back({{"name", c.name},
                                      {"function", c.function},
                                      {"problem", c.problem->problem.name()},
                                      {"gflop", w.flops * 1e-9},
                                      {"gbyte", w.bytes * 1e-9}});
                }
                reply({{"context", context_json()}, {"problems", problems_json()}, {"cases", listed}});
            } else if (command == "prepare") {
                auto found = by_name.find(name);
                if (found == by_name.end()) throw Error("prepare", "no case named '" + name + "'");
                Prepared p = found->second->prepare();
                nlohmann::json answer{{"name", name}, {"ok", p.error.empty()}, {"error", p.error}};
                if (p.max_error >= 0) answer["max_error"] = p.max_error;
                if (p.error.empty()) {
                    answer["peak_bytes"] = peak_memory.measure(p.run);
                    prepared[name] = std::move(p);
                }
                reply(answer);
            } else if (command == "time") {
                double seconds = 0;
                if (!(words >> seconds)) throw Error("time", "expected: time <case> <seconds>");
                auto found = prepared.find(name);
                if (found == prepared.end()) throw Error("time", "case '" + name + "' is not prepared");
                int runs = 0;
                const auto start = std::chrono::steady_clock::now();
                double elapsed = 0;
                do {
                    found->second.run();
                    ++runs;
                    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                } while (elapsed < seconds);
                reply({{"ms", elapsed * 1e3 / runs}, {"runs", runs}});
            } else if (command == "release") {
                prepared.clear();
                release_fixtures();
                reply({{"released", true}});
            } else {
                throw Error("command", "unknown command '" + command + "' (list, prepare, time, release)");
            }
        } catch (const std::exception &e) {
            reply({{"error", e.what()}});
        }
    }
    return 0;
}

}  // namespace attn::bench
