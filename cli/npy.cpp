#include "npy.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>
#include <sstream>

namespace attn::cli {
namespace {

struct DTypeInfo {
    DType dtype;
    const char *name;
    const char *descr;  // the .npy descr without its byte-order character
    std::size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::bool_, "bool", "b1", 1},      {DType::int8, "int8", "i1", 1},       {DType::uint8, "uint8", "u1", 1},
    {DType::int16, "int16", "i2", 2},     {DType::uint16, "uint16", "u2", 2},   {DType::int32, "int32", "i4", 4},
    {DType::uint32, "uint32", "u4", 4},   {DType::int64, "int64", "i8", 8},     {DType::uint64, "uint64", "u8", 8},
    {DType::float16, "float16", "f2", 2}, {DType::bfloat16, "bfloat16", "", 2}, {DType::float32, "float32", "f4", 4},
    {DType::float64, "float64", "f8", 8},
};

const DTypeInfo &info(DType dtype) {
    for (const DTypeInfo &i : kDTypes) {
        if (i.dtype == dtype) return i;
    }
    throw std::logic_error("unknown dtype");
}

template <typename T>
T load(const unsigned char *p) {
    T value;
    std::memcpy(&value, p, sizeof(T));
    return value;
}

float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    float magnitude;
    if (exponent == 0) {
        magnitude = std::ldexp(float(mantissa), -24);  // zero or subnormal
    } else if (exponent == 31) {
        magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    } else {
        magnitude = std::ldexp(float(mantissa | 0x400), int(exponent) - 25);
    }
    uint32_t bits;
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
    float result;
    std::memcpy(&result, &bits, 4);
    return result;
}

double element_as_double(DType dtype, const unsigned char *p) {
    switch (dtype) {
        case DType::bool_:
            return *p ? 1.0 : 0.0;
        case DType::int8:
            return load<int8_t>(p);
        case DType::uint8:
            return load<uint8_t>(p);
        case DType::int16:
            return load<int16_t>(p);
        case DType::uint16:
            return load<uint16_t>(p);
        case DType::int32:
            return load<int32_t>(p);
        case DType::uint32:
            return load<uint32_t>(p);
        case DType::int64:
            return double(load<int64_t>(p));
        case DType::uint64:
            return double(load<uint64_t>(p));
        case DType::float16:
            return half_to_float(load<uint16_t>(p));
        case DType::bfloat16: {
            const uint32_t bits = uint32_t(load<uint16_t>(p)) << 16;
            float f;
            std::memcpy(&f, &bits, 4);
            return f;
        }
        case DType::float32:
            return load<float>(p);
        case DType::float64:
            return load<double>(p);
    }
    return 0;
}

bool is_floating(DType dtype) {
    return dtype == DType::float16 || dtype == DType::bfloat16 || dtype == DType::float32 || dtype == DType::float64;
}

}  // namespace

std::string dtype_name(DType dtype) { return info(dtype).name; }
std::size_t dtype_size(DType dtype) { return info(dtype).size; }

int64_t Array::element_count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::size_t byte_count(DType dtype, const Shape &shape) {
    std::size_t bytes = dtype_size(dtype);
    for (int64_t d : shape) {
        if (d != 0 && bytes > std::numeric_limits<std::size_t>::max() / std::size_t(d)) {
            return std::numeric_limits<std::size_t>::max();
        }
        bytes *= std::size_t(d);
    }
    return bytes;
}

std::string shape_string(const Shape &shape) {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string read_file(const std::string &path, const std::string &argument) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(argument, "cannot open " + path + ": " + std::strerror(errno));
    return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<float> to_float32(const Array &array, const std::string &argument) {
    if (!is_floating(array.dtype)) {
        throw Error(argument, "expected a floating-point tensor (float32, float16, bfloat16 or float64), got " +
                                  dtype_name(array.dtype));
    }
    std::vector<float> out(array.element_count());
    const std::size_t size = dtype_size(array.dtype);
    if (array.dtype == DType::float32) {
        // Not for zero elements: both pointers may be null then, which memcpy must not get.
        if (!out.empty()) std::memcpy(out.data(), array.bytes.data(), out.size() * 4);
    } else {
        for (std::size_t i = 0; i < out.size(); ++i)
            out[i] = float(element_as_double(array.dtype, &array.bytes[i * size]));
    }
    return out;
}

std::vector<uint8_t> to_mask(const Array &array, const std::string &argument) {
    std::vector<uint8_t> out(array.element_count());
    const std::size_t size = dtype_size(array.dtype);
    for (std::size_t i = 0; i < out.size(); ++i) {
        const double value = element_as_double(array.dtype, &array.bytes[i * size]);
        if (value != 0.0 && value != 1.0) {
            std::ostringstream message;
            message << "a mask holds 0 (padding) or 1 (real token), but element " << i << " is " << value;
            throw Error(argument, message.str());
        }
        out[i] = value == 1.0;
    }
    return out;
}

Array read_npy(const std::string &path, const std::string &argument) {
    return parse_npy(read_file(path, argument), path, argument);
}

Array parse_npy(const std::string &file, const std::string &path, const std::string &argument) {
    auto fail = [&](const std::string &why) { return Error(argument, path + ": " + why); };
    static const std::string magic = "\x93NUMPY";
    if (file.compare(0, magic.size(), magic) != 0) throw fail("not a NumPy .npy file (no \\x93NUMPY magic)");
    if (file.size() < 10) throw fail("truncated header");
    const int major = static_cast<unsigned char>(file[6]);
    std::size_t header_len, header_start;
    if (major == 1) {
        header_len = load<uint16_t>(reinterpret_cast<const unsigned char *>(&file[8]));
        header_start = 10;
    } else if (major == 2 || major == 3) {
        if (file.size() < 12) throw fail("truncated header");
        header_len = load<uint32_t>(reinterpret_cast<const unsigned char *>(&file[8]));
        header_start = 12;
    } else {
        throw fail("unsupported .npy format version " + std::to_string(major));
    }
    if (header_start + header_len > file.size()) throw fail("truncated header");
    const std::string header = file.substr(header_start, header_len);

    // Compiled once: building a std::regex costs more than reading a header.
    static const std::regex descr_key(R"('descr'\s*:\s*'([^']*)')"),
        fortran_key(R"('fortran_order'\s*:\s*(True|False))"), shape_key(R"('shape'\s*:\s*\(([^)]*)\))");
    std::smatch m;
    if (!std::regex_search(header, m, descr_key)) throw fail("header has no 'descr'");
    const std::string descr = m[1];
    if (!std::regex_search(header, m, fortran_key)) {
        throw fail("header has no 'fortran_order'");
    }
    if (m[1] == "True") throw fail("Fortran-ordered arrays are not supported; save np.ascontiguousarray(a)");
    if (!std::regex_search(header, m, shape_key)) throw fail("header has no 'shape'");
    const std::string shape_text = m[1];

    Array array;
    const char order = descr.empty() ? '?' : descr[0];
    if (order == '>' && descr.substr(1) != "i1" && descr.substr(1) != "u1" && descr.substr(1) != "b1") {
        throw fail("big-endian data ('" + descr + "') is not supported; save a.astype(a.dtype.newbyteorder('<'))");
    }
    bool known = false;
    if (order == '<' || order == '|' || order == '=' || order == '>') {
        for (const DTypeInfo &i : kDTypes) {
            if (*i.descr && descr.substr(1) == i.descr) {
                array.dtype = i.dtype;
                known = true;
            }
        }
    }
    if (!known) throw fail("unsupported dtype '" + descr + "' (bool, integers, float16, float32 and float64 are)");

    std::stringstream dims(shape_text);
    std::string dim;
    while (std::getline(dims, dim, ',')) {
        dim.erase(0, dim.find_first_not_of(" \t"));
        dim.erase(dim.find_last_not_of(" \tL") + 1);
        if (dim.empty()) continue;
        if (dim.find_first_not_of("0123456789") != std::string::npos || dim.size() > 18) {
            throw fail("malformed shape (" + shape_text + ")");
        }
        array.shape.push_back(std::stoll(dim));
    }

    const std::size_t data_bytes = file.size() - header_start - header_len;
    const std::size_t expected = byte_count(array.dtype, array.shape);
    if (expected != data_bytes) {
        throw fail(
            "header says " + dtype_name(array.dtype) + " " + array.shape_string() + " (" +
            (expected == std::numeric_limits<std::size_t>::max() ? std::string("too many") : std::to_string(expected)) +
            " bytes of data), but the file has " + std::to_string(data_bytes));
    }
    array.bytes.assign(file.begin() + std::ptrdiff_t(header_start + header_len), file.end());
    return array;
}

void write_npy(const std::string &path, const Shape &shape, const std::vector<float> &data,
               const std::string &argument) {
    std::string dims;
    for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
    if (shape.size() == 1) dims += ",";
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
    const std::size_t unpadded = 10 + header.size() + 1;  // magic, version, length, header, '\n'
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';

    std::ofstream out(path, std::ios::binary);
    if (!out) throw Error(argument, "cannot write " + path + ": " + std::strerror(errno));
    const uint16_t header_len = uint16_t(header.size());
    out.write("\x93NUMPY\x01\x00", 8);
    out.write(reinterpret_cast<const char *>(&header_len), 2);
    out << header;
    out.write(reinterpret_cast<const char *>(data.data()), std::streamsize(data.size() * sizeof(float)));
    if (!out.flush()) throw Error(argument, "cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace attn::cli
