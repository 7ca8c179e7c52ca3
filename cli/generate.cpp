// `attn generate`: runs the generators (the attn_generators executable built with this
// tool) for another target, writing one static library and header per AOT function,
// a standalone Halide runtime and a manifest, ready to link.
#include "commands.h"

#include "attn/attention.h"

#include <nlohmann/json.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <vector>

extern char **environ;

namespace attn::cli {
namespace fs = std::filesystem;
namespace {

struct Stage {
    const char *function, *generator, *params;  // params: comma-separated generator params
};
constexpr Stage kStages[] = {
#define ATTN_STAGE(function, generator, params) {function, generator, params},
#include "attn/generated/stages.inc"
#undef ATTN_STAGE
};

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
    throw Error("--generator", "cannot find attn_generators (looked in $ATTN_GENERATORS, " + candidates[candidates.size() - 2].string() +
                                   " and " + candidates.back().string() + "); pass its path");
}

int spawn_and_wait(const std::vector<std::string> &args) {
    std::vector<char *> argv;
    for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    if (const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ)) {
        throw Error("--generator", "cannot run " + args[0] + ": " + std::strerror(err));
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) throw Error("--generator", std::string("waitpid: ") + std::strerror(errno));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string c_identifier(const std::string &s) {
    std::string out;
    for (char c : s) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return out;
}

}  // namespace

int generate_libraries(const GenerateOptions &options) {
    std::set<std::string> schedules;
    for (const VariantInfo &v : variants()) schedules.insert(v.schedule);
    if (!schedules.count(options.schedule)) {
        std::string known;
        for (const std::string &s : schedules) known += (known.empty() ? "" : ", ") + s;
        throw Error("--schedule", "unknown schedule source '" + options.schedule + "'; this build has " + known);
    }
    if (options.target.empty()) throw Error("--target", "empty; give a Halide target such as arm-64-linux");
    const std::string generator = find_generator(options.generator);
    const std::string suffix = options.name_suffix.empty() ? c_identifier(options.target) : options.name_suffix;

    std::error_code ec;
    fs::create_directories(options.out, ec);
    if (ec) throw Error("--out", "cannot create " + options.out + ": " + ec.message());

    nlohmann::json manifest = {{"target", options.target},
                               {"schedule", options.schedule},
                               {"halide_version", ATTN_HALIDE_VERSION},
                               {"runtime", "attn_halide_runtime.a"},
                               {"functions", nlohmann::json::array()}};
    int index = 0;
    for (const Stage &stage : kStages) {
        const std::string function = std::string("attn_") + stage.function + "_" + options.schedule + "_" + suffix;
        std::printf("[%d/%zu] %s\n", ++index, std::size(kStages) + 1, function.c_str());
        std::fflush(stdout);
        // Each function without its own runtime: they share attn_halide_runtime.a.
        std::vector<std::string> args = {generator, "-g", stage.generator, "-f", function, "-o", options.out,
                                         "-e", "static_library,c_header", "target=" + options.target + "-no_runtime",
                                         "schedule=" + options.schedule};
        if (options.schedule == "li2018") args.insert(args.begin() + 1, {"-p", ATTN_LI2018_PLUGIN});
        std::string params = stage.params;
        for (std::size_t start = 0; start < params.size();) {
            const std::size_t comma = std::min(params.find(',', start), params.size());
            args.push_back(params.substr(start, comma - start));
            start = comma + 1;
        }
        if (const int status = spawn_and_wait(args)) {
            throw Error("--target", "attn_generators failed on " + std::string(stage.function) + " for target '" +
                                        options.target + "' with schedule '" + options.schedule + "' (exit " +
                                        std::to_string(status) + "; its message is above)");
        }
        manifest["functions"].push_back({{"name", function}, {"header", function + ".h"}, {"library", function + ".a"}});
    }
    std::printf("[%zu/%zu] attn_halide_runtime\n", std::size(kStages) + 1, std::size(kStages) + 1);
    std::fflush(stdout);
    if (const int status = spawn_and_wait({generator, "-r", "attn_halide_runtime", "-o", options.out, "-e",
                                           "static_library", "target=" + options.target})) {
        throw Error("--target", "attn_generators could not build the Halide runtime for '" + options.target +
                                    "' (exit " + std::to_string(status) + ")");
    }
    std::ofstream(fs::path(options.out) / "manifest.json") << manifest.dump(2) << "\n";
    std::printf("wrote %zu libraries, their headers, attn_halide_runtime.a and manifest.json to %s\n",
                std::size(kStages), options.out.c_str());
    return 0;
}

}  // namespace attn::cli
