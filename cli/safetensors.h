// Hugging Face safetensors files: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets}}, then the tensor bytes.
#pragma once

#include "npy.h"

#include <map>
#include <string>

namespace attn::cli {

class SafetensorsFile {
public:
    // Reads and validates the whole file; errors name `argument` and the path.
    SafetensorsFile(const std::string &path, const std::string &argument);
    // The same from the file's bytes (`path` only names it in errors).
    SafetensorsFile(const std::string &path, const std::string &argument, const std::string &bytes);

    bool contains(const std::string &name) const { return tensors_.count(name) != 0; }
    const Array &tensor(const std::string &name) const;  // throws if absent
    const std::map<std::string, Array> &tensors() const { return tensors_; }
    const std::string &path() const { return path_; }

private:
    std::string path_, argument_;
    std::map<std::string, Array> tensors_;
};

}  // namespace attn::cli
