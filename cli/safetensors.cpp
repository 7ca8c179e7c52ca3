#include "safetensors.h"

#include <nlohmann/json.hpp>

#include <cstring>

namespace attn::cli {
namespace {

// safetensors dtype names; BOOL and the 8-bit floats are not weights we convert.
bool parse_dtype(const std::string &name, DType &dtype) {
    static const std::map<std::string, DType> names = {
        {"F64", DType::float64}, {"F32", DType::float32}, {"F16", DType::float16}, {"BF16", DType::bfloat16},
        {"I64", DType::int64},   {"I32", DType::int32},   {"I16", DType::int16},   {"I8", DType::int8},
        {"U64", DType::uint64},  {"U32", DType::uint32},  {"U16", DType::uint16},  {"U8", DType::uint8},
        {"BOOL", DType::bool_}};
    const auto it = names.find(name);
    if (it == names.end()) return false;
    dtype = it->second;
    return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string &path, const std::string &argument)
    : SafetensorsFile(path, argument, read_file(path, argument)) {}

SafetensorsFile::SafetensorsFile(const std::string &path, const std::string &argument, const std::string &file)
    : path_(path), argument_(argument) {
    auto fail = [&](const std::string &why) { return Error(argument, path + ": " + why); };
    if (file.size() < 8) throw fail("not a safetensors file (shorter than its 8-byte header length)");
    uint64_t header_len;
    std::memcpy(&header_len, file.data(), 8);
    if (header_len > file.size() - 8) {
        throw fail("not a safetensors file (header length " + std::to_string(header_len) + " exceeds the file's " +
                   std::to_string(file.size()) + " bytes)");
    }
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + std::ptrdiff_t(header_len));
    } catch (const nlohmann::json::exception &e) {
        throw fail(std::string("malformed safetensors header: ") + e.what());
    }
    if (!header.is_object()) throw fail("malformed safetensors header: not a JSON object");
    const std::size_t data_start = 8 + header_len, data_size = file.size() - data_start;

    for (const auto &item : header.items()) {
        const std::string &name = item.key();  // not a structured binding: the lambdas below capture it
        const nlohmann::json &entry = item.value();
        if (name == "__metadata__") continue;
        auto bad = [&](const std::string &why) { return fail("tensor '" + name + "': " + why); };
        if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
            !entry.contains("data_offsets")) {
            throw bad("entry needs dtype, shape and data_offsets");
        }
        Array array;
        if (!entry["dtype"].is_string() || !parse_dtype(entry["dtype"].get<std::string>(), array.dtype)) {
            throw bad("unsupported dtype " + entry["dtype"].dump());
        }
        const auto &shape = entry["shape"], &offsets = entry["data_offsets"];
        if (!shape.is_array()) throw bad("shape is not a list");
        for (const auto &d : shape) {
            if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40)) {
                throw bad("shape " + shape.dump() + " is not a list of sizes");
            }
            array.shape.push_back(d.get<int64_t>());
        }
        if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
            !offsets[1].is_number_unsigned()) {
            throw bad("data_offsets must be [begin, end]");
        }
        const uint64_t begin = offsets[0], end = offsets[1];
        if (begin > end || end > data_size) {
            throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] outside the " +
                      std::to_string(data_size) + " data bytes");
        }
        if (byte_count(array.dtype, array.shape) != end - begin) {
            throw bad(entry["dtype"].get<std::string>() + " " + array.shape_string() + " does not fit its " +
                      std::to_string(end - begin) + " bytes");
        }
        const auto data = file.begin() + std::ptrdiff_t(data_start + begin);
        array.bytes.assign(data, data + std::ptrdiff_t(end - begin));
        tensors_.emplace(name, std::move(array));
    }
}

const Array &SafetensorsFile::tensor(const std::string &name) const {
    const auto it = tensors_.find(name);
    if (it == tensors_.end()) throw Error(argument_, path_ + ": no tensor '" + name + "'");
    return it->second;
}

}  // namespace attn::cli
