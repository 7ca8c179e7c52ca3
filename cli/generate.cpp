// `attn generate`: runs the generators (the attn_generators executable built with this
// tool) for another target, writing one static library and header per AOT function,
// a standalone Halide runtime and a manifest, ready to link.
#include "commands.h"

#include "attn/attention.h"
#include "attn/generated/manifest.h"

#include <nlohmann/json.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <vector>

extern char **environ;

namespace attn::cli {
namespace fs = std::filesystem;
namespace {

fs::path executable_dir() {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    return ec ? fs::path() : self.parent_path();
}

// --generator, then $ATTN_GENERATORS, then beside an installed attn, then the build tree.
std::string find_generator(const std::string &given) {
    std::error_code ec;
    if (!given.empty()) {
        if (!fs::exists(given, ec)) throw Error("--generator", given + " does not exist");
        return given;
    }
    std::vector<fs::path> candidates;
    if (const char *env = std::getenv("ATTN_GENERATORS")) candidates.emplace_back(env);
    candidates.push_back(executable_dir() / ATTN_GENERATORS_INSTALL_RELPATH);
    candidates.emplace_back(ATTN_GENERATORS_BUILD_PATH);
    for (const fs::path &c : candidates) {
        if (fs::exists(c, ec)) return c.string();
    }
    throw Error("--generator", "cannot find attn_generators (looked in $ATTN_GENERATORS, " +
                                   candidates[candidates.size() - 2].string() + " and " + candidates.back().string() +
                                   "); pass its path");
}

pid_t spawn(const std::vector<std::string> &args) {
    std::vector<char *> argv;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    if (const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ)) {
        throw Error("--generator", "cannot run " + args[0] + ": " + std::strerror(err));
    }
    return pid;
}

struct Job {
    std::string label;
    std::vector<std::string> args;
};

// Runs the jobs, `parallel` at a time; returns the first failed job's label and exit
// status, after letting the ones already running finish.
std::optional<std::pair<std::string, int>> run_jobs(const std::vector<Job> &jobs, int parallel) {
    std::map<pid_t, std::string> running;
    std::optional<std::pair<std::string, int>> failure;
    std::size_t next = 0, done = 0;
    while (done < jobs.size()) {
        while (!failure && next < jobs.size() && int(running.size()) < parallel) {
            running[spawn(jobs[next].args)] = jobs[next].label;
            ++next;
        }
        if (running.empty()) break;
        int status = 0;
        const pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR) continue;
            throw Error("--generator", std::string("waitpid: ") + std::strerror(errno));
        }
        const auto it = running.find(pid);
        if (it == running.end()) continue;
        const int exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        ++done;
        std::printf("[%zu/%zu] %s%s\n", done, jobs.size(), it->second.c_str(), exit_status ? " FAILED" : "");
        std::fflush(stdout);
        if (exit_status && !failure) failure = std::make_pair(it->second, exit_status);
        running.erase(it);
    }
    return failure;
}

std::vector<std::string> split_target(const std::string &target) {
    std::vector<std::string> parts;
    std::size_t start = 0;
    for (std::size_t dash; (dash = target.find('-', start)) != std::string::npos; start = dash + 1)
        parts.push_back(target.substr(start, dash - start));
    parts.push_back(target.substr(start));
    return parts;
}

// The manifest ISA a target is: of those of its architecture (the first two parts), the one
// with the most features in common with it, then the fewest others (so that
// x86-64-linux-avx2-fma is avx2, whose halide_target also names sse41 and avx); empty when
// none matches (e.g. "host").
std::string isa_of_target(const std::string &target) {
    const std::vector<std::string> parts = split_target(target);
    if (parts.size() < 2) return "";
    const std::set<std::string> features(parts.begin() + std::min<std::size_t>(parts.size(), 3), parts.end());
    std::string best;
    std::pair<std::size_t, std::size_t> best_score;  // (in common, -others), compared as a pair
    for (const manifest::Isa &isa : manifest::kIsas) {
        const std::vector<std::string> own = split_target(isa.halide_target);
        if (own.size() < 2 || own[0] != parts[0] || own[1] != parts[1]) continue;
        std::size_t common = 0;
        for (std::size_t i = 3; i < own.size(); ++i) common += features.count(own[i]);
        const std::pair<std::size_t, std::size_t> score{common, std::size_t(-1) - (own.size() - 3 - common)};
        if (best.empty() || score > best_score) best = isa.name, best_score = score;
    }
    return best;
}

bool provided(const std::string &source, const std::string &isa, const std::string &function) {
    return std::none_of(manifest::kNotProvided.begin(), manifest::kNotProvided.end(),
                        [&](const manifest::NotProvided &n) {
                            return source == n.source && function == n.function &&
                                   (std::string(n.isa) == "all" || isa == n.isa);
                        });
}

std::string c_identifier(const std::string &s) {
    std::string out;
    for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return out;
}

}  // namespace

int generate_libraries(const GenerateOptions &options) {
    // Hand-written, frozen and in-process sources, with the generator parameters the build
    // uses (manifest::kGeneratorParams); tuned parameters belong to one ISA: generate those
    // with --schedule manual and the parameters of generated/tuned/<isa>/<function>.json.
    std::string known;
    for (const manifest::ScheduleSource &s : manifest::kScheduleSources) {
        if (std::string(s.kind) != "tuned") known += (known.empty() ? "" : ", ") + std::string(s.name);
    }
    std::vector<const manifest::GeneratorParams *> functions;
    bool known_source = false;
    if (options.target.empty()) throw Error("--target", "empty; give a Halide target such as arm-64-linux");
    std::regex function_filter;
    try {
        function_filter = std::regex(options.functions.empty() ? ".*" : options.functions);
    } catch (const std::regex_error &e) {
        throw Error("--functions", "'" + options.functions + "' is not a regular expression: " + e.what());
    }
    // What the source cannot schedule on the target's ISA (manifest.json: not_provided) is
    // left out, as the build leaves it out of that ISA's variant.
    const std::string isa = isa_of_target(options.target);
    for (const manifest::GeneratorParams &g : manifest::kGeneratorParams) {
        if (options.schedule != g.source) continue;
        known_source = true;
        if (!std::regex_search(g.function, function_filter)) continue;
        if (provided(g.source, isa, g.function)) {
            functions.push_back(&g);
        } else {
            std::printf("leaving out %s: schedule %s cannot provide it on %s (manifest.json: not_provided, built_for, precisions)\n",
                        g.function, g.source, isa.c_str());
        }
    }
    if (!known_source) {
        throw Error("--schedule", "unknown schedule source '" + options.schedule + "'; manifest.json has " + known);
    }
    if (functions.empty()) {  // named by --functions only when the caller gave it
        if (options.functions.empty())
            throw Error("--schedule", "schedule " + options.schedule + " provides no function on " + isa);
        throw Error("--functions", "'" + options.functions + "' matches none of the functions schedule " +
                                       options.schedule + " provides on " + isa);
    }
    const std::string generator = find_generator(options.generator);
    const std::string suffix = options.name_suffix.empty() ? c_identifier(options.target) : options.name_suffix;

    nlohmann::json manifest = {{"target", options.target},
                               {"schedule", options.schedule},
                               {"halide_version", ATTN_HALIDE_VERSION},
                               {"runtime", "attn_halide_runtime.a"},
                               {"functions", nlohmann::json::array()}};
    std::vector<Job> jobs;
    for (const manifest::GeneratorParams *g : functions) {
        const std::string function = std::string("attn_") + g->function + "_" + options.schedule + "_" + suffix;
        std::string generator_name;
        for (const manifest::Function &f : manifest::kFunctions) {
            if (std::string(f.name) == g->function) generator_name = f.generator;
        }
        // Each function without its own runtime: they share attn_halide_runtime.a.
        Job job{function,
                {generator, "-g", generator_name, "-f", function, "-o", options.out, "-e", "static_library,c_header",
                 "target=" + options.target + "-no_runtime"}};
        if (*g->plugin) job.args.insert(job.args.begin() + 1, {"-p", ATTN_PLUGIN_DIR "/" + std::string(g->plugin)});
        job.args.insert(job.args.end(), g->params.begin(), g->params.end());
        jobs.push_back(std::move(job));
        manifest["functions"].push_back(
            {{"name", function}, {"header", function + ".h"}, {"library", function + ".a"}});
    }
    jobs.push_back({"attn_halide_runtime",
                    {generator, "-r", "attn_halide_runtime", "-o", options.out, "-e", "static_library",
                     "target=" + options.target}});
    if (options.dry_run) {
        for (const Job &job : jobs) std::printf("would generate %s\n", job.label.c_str());
        return 0;
    }
    std::error_code ec;
    fs::create_directories(options.out, ec);
    if (ec) throw Error("--out", "cannot create " + options.out + ": " + ec.message());
    const int parallel = options.jobs > 0 ? options.jobs : int(std::max(1u, std::thread::hardware_concurrency()));
    std::printf("generating %zu libraries for %s with schedule %s, %d at a time\n", jobs.size(), options.target.c_str(),
                options.schedule.c_str(), parallel);
    std::fflush(stdout);
    if (const auto failure = run_jobs(jobs, parallel)) {
        throw Error("--target", "attn_generators failed on " + failure->first + " for target '" + options.target +
                                    "' with schedule '" + options.schedule + "' (exit " +
                                    std::to_string(failure->second) + "; its message is above)");
    }
    std::ofstream(fs::path(options.out) / "manifest.json") << manifest.dump(2) << "\n";
    std::printf("wrote %zu libraries, their headers, attn_halide_runtime.a and manifest.json to %s\n", functions.size(),
                options.out.c_str());
    return 0;
}

}  // namespace attn::cli
