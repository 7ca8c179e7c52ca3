// A quiet build: Halide's compile-time warnings go to a file beside the generator's
// outputs (<-o dir>/<-f name>.halide_warnings.txt), and the build log shows one line
// per generator that warned. The few left are harmless and come from schedules we do
// not write by hand (a frozen autoscheduled schedule's unfolded storage) or from
// Halide itself (assertions it drops inside OpenCL kernels, which cannot report them);
// printed in full, each is a page of lowered IR that buries the build's own messages.
#include "Halide.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

namespace {

// The value after `flag` on this process's command line (GenGen's -o and -f), or "".
std::string command_line_value(const std::string &flag) {
    std::ifstream in("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> args;
    for (std::string arg; std::getline(in, arg, '\0');) args.push_back(arg);
    for (std::size_t i = 0; i + 1 < args.size(); ++i) {
        if (args[i] == flag) return args[i + 1];
    }
    return "";
}

class WarningsToFile : public Halide::CompileTimeErrorReporter {
public:
    WarningsToFile() { Halide::set_custom_compile_time_error_reporter(this); }
    ~WarningsToFile() override { write(); }

    void warning(const char *message) override { warnings_.emplace_back(message); }
    // Errors keep their path: the generator's main reports the exception and fails.
    [[noreturn]] void error(const char *message) override { throw Halide::CompileError(message); }

private:
    void write() const {
        if (warnings_.empty()) return;
        const std::string dir = command_line_value("-o"), name = command_line_value("-f");
        if (dir.empty() || name.empty()) {  // not a build step: print them as Halide would
            for (const std::string &w : warnings_) std::cerr << w;
            return;
        }
        const std::string path = std::filesystem::absolute(dir + "/" + name + ".halide_warnings.txt").lexically_normal();
        std::ofstream out(path);
        std::map<std::string, int> kinds;  // each warning's first words, counted
        for (const std::string &w : warnings_) {
            out << w << (w.empty() || w.back() != '\n' ? "\n" : "");
            const std::string first_line = w.substr(0, w.find('\n'));
            kinds[first_line.substr(0, first_line.find(' ', 40))]++;
        }
        std::cerr << name << ": " << warnings_.size() << " Halide warning" << (warnings_.size() == 1 ? "" : "s")
                  << " (";
        const char *separator = "";
        for (const auto &[kind, count] : kinds) {
            std::cerr << separator << count << "x \"" << kind << " ...\"";
            separator = "; ";
        }
        std::cerr << "), in " << path << "\n";
    }

    std::vector<std::string> warnings_;
};

const WarningsToFile warnings_to_file;

}  // namespace
