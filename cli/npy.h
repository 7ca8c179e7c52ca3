// NumPy .npy files: read any numeric or bool array (C order, little endian), write
// float32. Errors are attn::Error naming the command-line argument the file came from.
#pragma once

#include "attn/attention.h"

#include <cstdint>
#include <string>
#include <vector>

namespace attn::cli {

enum class DType {
    bool_,
    int8,
    uint8,
    int16,
    uint16,
    int32,
    uint32,
    int64,
    uint64,
    float16,
    bfloat16,
    float32,
    float64
};
std::string dtype_name(DType dtype);  // NumPy's name: "float32", "bool", ...
std::size_t dtype_size(DType dtype);
// The bytes a dtype and shape need, or SIZE_MAX where that overflows.
std::size_t byte_count(DType dtype, const Shape &shape);
std::string shape_string(const Shape &shape);  // "[2, 128, 768]"

// The whole file; attn::Error(argument, "cannot open ...") when it cannot be read.
std::string read_file(const std::string &path, const std::string &argument);

// An n-dimensional array as stored in a file, before conversion.
struct Array {
    DType dtype = DType::float32;
    Shape shape;
    std::vector<unsigned char> bytes;  // element_count() * dtype_size(dtype), little endian

    int64_t element_count() const;
    std::string shape_string() const { return cli::shape_string(shape); }
};

// Converts a floating-point array (float16, bfloat16, float32, float64) to float32.
std::vector<float> to_float32(const Array &array, const std::string &argument);
// Converts a bool, integer or float array of 0s and 1s to bytes of 0 and 1.
std::vector<uint8_t> to_mask(const Array &array, const std::string &argument);

Array read_npy(const std::string &path, const std::string &argument);
// The same from the file's bytes (`path` only names it in errors).
Array parse_npy(const std::string &bytes, const std::string &path, const std::string &argument);
void write_npy(const std::string &path, const Shape &shape, const std::vector<float> &data,
               const std::string &argument);

}  // namespace attn::cli
