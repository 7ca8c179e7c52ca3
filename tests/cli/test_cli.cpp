// The attn command line and its file readers: NumPy, safetensors and BERT checkpoints,
// read correctly, and every kind of malformed input refused with a message naming the
// argument and a non-zero exit.
#include "checkpoint.h"
#include "npy.h"
#include "problems/problem.h"
#include "safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

namespace attn::cli {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory per test.
class CliTest : public ::testing::Test {
protected:
    void SetUp() override {
        const auto *info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = fs::temp_directory_path() / ("attn_cli_tests_" + std::to_string(::getpid())) /
               (std::string(info->test_suite_name()) + "." + info->name());
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_.parent_path()); }
    std::string path(const std::string &name) const { return (dir_ / name).string(); }

    fs::path dir_;
};

void write_file(const std::string &path, const std::string &bytes) { std::ofstream(path, std::ios::binary) << bytes; }

std::string raw(const void *data, std::size_t n) { return std::string(static_cast<const char *>(data), n); }

// A .npy file with any header text, for malformed cases.
std::string npy_file(const std::string &header_dict, const std::string &data) {
    std::string header = header_dict;
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    const uint16_t len = uint16_t(header.size());
    return std::string("\x93NUMPY\x01\x00", 8) + raw(&len, 2) + header + data;
}
std::string npy_header(const std::string &descr, const std::string &shape, bool fortran = false) {
    return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape +
           ", }";
}

struct Tensor {
    std::string dtype;
    Shape shape;
    std::string bytes;
};
std::string safetensors_file(const std::map<std::string, Tensor> &tensors) {
    json header = {{"__metadata__", {{"format", "pt"}}}};
    std::string data;
    for (const auto &[name, t] : tensors) {
        header[name] = {
            {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
        data += t.bytes;
    }
    const std::string text = header.dump();
    const uint64_t len = text.size();
    return raw(&len, 8) + text + data;
}
Tensor f32(const std::vector<float> &values, Shape shape) {
    return {"F32", std::move(shape), raw(values.data(), values.size() * 4)};
}

// Runs the attn executable; returns its exit status and what it printed (both streams).
struct Result {
    int status;
    std::string output;
};
Result attn(const std::string &args) {
    const std::string command = std::string(ATTN_CLI_PATH) + " " + args + " 2>&1";
    FILE *pipe = popen(command.c_str(), "r");
    Result r{-1, ""};
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.output.append(buffer, n);
    const int status = pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

// ---- NumPy ----

TEST_F(CliTest, NpyRoundTripsFloat32) {
    std::vector<float> values(24);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * float(i) - 3;
    write_npy(path("a.npy"), {2, 3, 4}, values, "--output");
    const Array a = read_npy(path("a.npy"), "--input");
    EXPECT_EQ(a.dtype, DType::float32);
    EXPECT_EQ(a.shape, (Shape{2, 3, 4}));
    EXPECT_EQ(to_float32(a, "--input"), values);
    // The header is padded so the data starts 64-byte aligned, as NumPy writes it.
    EXPECT_EQ(fs::file_size(path("a.npy")) % 64, (24 * 4) % 64);
}

TEST_F(CliTest, NpyConvertsHalfBfloatAndDoubleToFloat32) {
    const uint16_t half[] = {0x3c00, 0xc100, 0x7bff, 0x0001};  // 1, -2.5, 65504, 2^-24
    write_file(path("h.npy"), npy_file(npy_header("<f2", "(4,)"), raw(half, sizeof half)));
    EXPECT_EQ(to_float32(read_npy(path("h.npy"), "--x"), "--x"),
              (std::vector<float>{1, -2.5f, 65504, std::ldexp(1.0f, -24)}));
    const double d[] = {0.25, -1e10};
    write_file(path("d.npy"), npy_file(npy_header("<f8", "(2,)"), raw(d, sizeof d)));
    EXPECT_EQ(to_float32(read_npy(path("d.npy"), "--x"), "--x"), (std::vector<float>{0.25f, -1e10f}));
}

TEST_F(CliTest, MasksAcceptBoolIntegerAndFloatZerosAndOnes) {
    const uint8_t b[] = {1, 0, 1};
    const int64_t i[] = {1, 1, 0};
    const float f[] = {0, 1, 1};
    write_file(path("b.npy"), npy_file(npy_header("|b1", "(1, 3)"), raw(b, 3)));
    write_file(path("i.npy"), npy_file(npy_header("<i8", "(1, 3)"), raw(i, 24)));
    write_file(path("f.npy"), npy_file(npy_header("<f4", "(1, 3)"), raw(f, 12)));
    EXPECT_EQ(to_mask(read_npy(path("b.npy"), "--mask"), "--mask"), (std::vector<uint8_t>{1, 0, 1}));
    EXPECT_EQ(to_mask(read_npy(path("i.npy"), "--mask"), "--mask"), (std::vector<uint8_t>{1, 1, 0}));
    EXPECT_EQ(to_mask(read_npy(path("f.npy"), "--mask"), "--mask"), (std::vector<uint8_t>{0, 1, 1}));

    const int32_t bad[] = {1, 2};
    write_file(path("bad.npy"), npy_file(npy_header("<i4", "(1, 2)"), raw(bad, 8)));
    try {
        to_mask(read_npy(path("bad.npy"), "--mask"), "--mask");
        FAIL() << "a mask value of 2 was accepted";
    } catch (const Error &e) {
        EXPECT_EQ(e.argument(), "--mask");
        EXPECT_NE(std::string(e.what()).find("element 1 is 2"), std::string::npos) << e.what();
    }
}

TEST_F(CliTest, MalformedNpyFilesAreRefusedWithTheReason) {
    const float four[] = {1, 2, 3, 4};
    const std::map<std::string, std::pair<std::string, std::string>> cases = {
        {"missing", {"", "cannot open"}},
        {"not_npy", {"hello, world", "not a NumPy .npy file"}},
        {"short_header", {std::string("\x93NUMPY\x01\x00\xff\x00{", 11), "truncated header"}},
        {"truncated",
         {npy_file(npy_header("<f4", "(2, 4)"), raw(four, 16)), "(32 bytes of data), but the file has 16"}},
        {"trailing", {npy_file(npy_header("<f4", "(2,)"), raw(four, 16)), "but the file has 16"}},
        {"fortran", {npy_file(npy_header("<f4", "(2, 2)", true), raw(four, 16)), "Fortran-ordered"}},
        {"big_endian", {npy_file(npy_header(">f4", "(4,)"), raw(four, 16)), "big-endian"}},
        {"complex", {npy_file(npy_header("<c8", "(2,)"), raw(four, 16)), "unsupported dtype '<c8'"}},
        {"no_shape", {npy_file("{'descr': '<f4', 'fortran_order': False, }", raw(four, 16)), "no 'shape'"}},
        {"bad_shape", {npy_file(npy_header("<f4", "(2, x)"), raw(four, 16)), "malformed shape"}},
        {"huge_shape",
         {npy_file(npy_header("<f4", "(4294967296, 4294967296, 4294967296)"), raw(four, 16)), "too many"}},
        {"version", {std::string("\x93NUMPY\x09\x00\x00\x00", 10), "version 9"}},
    };
    for (const auto &[name, c] : cases) {
        const std::string file = path(name + ".npy");
        if (name != "missing") write_file(file, c.first);
        try {
            read_npy(file, "--input");
            ADD_FAILURE() << name << ": accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), "--input") << name;
            EXPECT_NE(std::string(e.what()).find(c.second), std::string::npos) << name << ": " << e.what();
            EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << name << ": names the file";
        }
    }
}

// ---- safetensors ----

TEST_F(CliTest, SafetensorsReadsFloat32Float16AndBfloat16) {
    const uint16_t half[] = {0x3c00, 0xc000}, bf16[] = {0x3f80, 0xc040};  // {1, -2}, {1, -3}
    write_file(path("m.safetensors"), safetensors_file({{"a", f32({1, 2, 3, 4, 5, 6}, {2, 3})},
                                                        {"h", {"F16", {2}, raw(half, 4)}},
                                                        {"b", {"BF16", {2}, raw(bf16, 4)}}}));
    const SafetensorsFile file(path("m.safetensors"), "--model");
    EXPECT_EQ(file.tensor("a").shape, (Shape{2, 3}));
    EXPECT_EQ(to_float32(file.tensor("a"), "a"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
    EXPECT_EQ(to_float32(file.tensor("h"), "h"), (std::vector<float>{1, -2}));
    EXPECT_EQ(to_float32(file.tensor("b"), "b"), (std::vector<float>{1, -3}));
    EXPECT_THROW(file.tensor("missing"), Error);
}

TEST_F(CliTest, MalformedSafetensorsFilesAreRefusedWithTheReason) {
    const std::string good = safetensors_file({{"a", f32({1, 2}, {2})}});
    auto with_header = [](const std::string &text, const std::string &data) {
        const uint64_t len = text.size();
        return raw(&len, 8) + text + data;
    };
    const std::map<std::string, std::pair<std::string, std::string>> cases = {
        {"short", {"abc", "shorter than its 8-byte header length"}},
        {"long_header", {good.substr(0, 20), "exceeds the file's"}},
        {"bad_json", {with_header("{not json", ""), "malformed safetensors header"}},
        {"not_object", {with_header("[1, 2]", ""), "not a JSON object"}},
        {"no_offsets",
         {with_header(R"({"a": {"dtype": "F32", "shape": [2]}})", std::string(8, '\0')),
          "needs dtype, shape and data_offsets"}},
        {"outside",
         {with_header(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 80]}})", std::string(8, '\0')),
          "outside the 8 data bytes"}},
        {"misfit",
         {with_header(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", std::string(8, '\0')),
          "does not fit its 8 bytes"}},
        {"fp8",
         {with_header(R"({"a": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}})", std::string(8, '\0')),
          "unsupported dtype"}},
        {"negative",
         {with_header(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", std::string(8, '\0')),
          "not a list of sizes"}},
    };
    for (const auto &[name, c] : cases) {
        write_file(path(name), c.first);
        try {
            SafetensorsFile(path(name), "--model");
            ADD_FAILURE() << name << ": accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), "--model") << name;
            EXPECT_NE(std::string(e.what()).find(c.second), std::string::npos) << name << ": " << e.what();
        }
    }
}

// ---- BERT checkpoints ----

// A small BERT checkpoint (hidden 8, 2 layers) with seeded weights, under `leading`.
struct TinyBert {
    static constexpr int64_t hidden = 8;
    std::map<std::string, Tensor> tensors;
    std::map<std::string, std::vector<float>> values;

    explicit TinyBert(const std::string &leading = "bert.", int layers = 2) {
        std::mt19937 rng(5);
        std::normal_distribution<float> normal(0, 0.3f);
        for (int layer = 0; layer < layers; ++layer) {
            const std::string p = leading + "encoder.layer." + std::to_string(layer) + ".attention.";
            for (const std::string &name : {"self.query", "self.key", "self.value", "output.dense"}) {
                add(p + name + ".weight", {hidden, hidden}, normal, rng);
                add(p + name + ".bias", {hidden}, normal, rng);
            }
            add(p + "output.LayerNorm.weight", {hidden}, normal, rng);
            add(p + "output.LayerNorm.bias", {hidden}, normal, rng);
        }
        tensors[leading + "embeddings.position_ids"] = {"I64", {1, 4}, std::string(32, '\0')};
    }
    void add(const std::string &name, Shape shape, std::normal_distribution<float> &normal, std::mt19937 &rng) {
        std::vector<float> v(shape.size() == 2 ? shape[0] * shape[1] : shape[0]);
        for (float &e : v) e = normal(rng);
        values[name] = v;
        tensors[name] = f32(v, std::move(shape));
    }
    void write(
        const std::string &dir,
        const std::string &config = R"({"num_attention_heads": 2, "layer_norm_eps": 1e-5, "hidden_size": 8})") const {
        fs::create_directories(dir);
        write_file(dir + "/model.safetensors", safetensors_file(tensors));
        if (!config.empty()) write_file(dir + "/config.json", config);
    }
};

TEST_F(CliTest, CheckpointLayerFoundUnderAnyLeadingNameWithConfigFromConfigJson) {
    const TinyBert bert("bert.");
    bert.write(path("model"));
    const CheckpointLayer layer = load_bert_layer(path("model"), 1, std::nullopt, std::nullopt);
    EXPECT_EQ(layer.prefix, "bert.encoder.layer.1.attention.");
    EXPECT_EQ(layer.config.hidden_size, 8);
    EXPECT_EQ(layer.config.num_heads, 2);
    EXPECT_FLOAT_EQ(layer.config.layer_norm_eps, 1e-5f);
    EXPECT_EQ(layer.w_k, bert.values.at("bert.encoder.layer.1.attention.self.key.weight"));
    EXPECT_EQ(layer.beta, bert.values.at("bert.encoder.layer.1.attention.output.LayerNorm.bias"));
    // Flags win over config.json.
    const CheckpointLayer flagged = load_bert_layer(path("model/model.safetensors"), 0, 4, 1e-6f);
    EXPECT_EQ(flagged.config.num_heads, 4);
    EXPECT_FLOAT_EQ(flagged.config.layer_norm_eps, 1e-6f);
}

TEST_F(CliTest, CheckpointWithoutLeadingNameOldLayerNormNamesAndHalfPrecision) {
    TinyBert bert("");
    for (int layer = 0; layer < 2; ++layer) {
        const std::string p = "encoder.layer." + std::to_string(layer) + ".attention.output.LayerNorm.";
        bert.tensors[p + "gamma"] = bert.tensors.at(p + "weight");
        bert.tensors[p + "beta"] = bert.tensors.at(p + "bias");
        bert.tensors.erase(p + "weight");
        bert.tensors.erase(p + "bias");
    }
    // The query weight stored as float16: 1.5 everywhere.
    bert.tensors["encoder.layer.0.attention.self.query.weight"] = {"F16", {8, 8}, std::string()};
    for (int i = 0; i < 64; ++i)
        bert.tensors["encoder.layer.0.attention.self.query.weight"].bytes += std::string("\x00\x3e", 2);
    bert.write(path("model"), "");
    const CheckpointLayer layer = load_bert_layer(path("model"), 0, 2, std::nullopt);
    EXPECT_EQ(layer.prefix, "encoder.layer.0.attention.");
    EXPECT_EQ(layer.gamma, bert.values.at("encoder.layer.0.attention.output.LayerNorm.weight"));
    EXPECT_EQ(layer.w_q, std::vector<float>(64, 1.5f));
    EXPECT_FLOAT_EQ(layer.config.layer_norm_eps, 1e-12f);  // BERT's default without config.json
}

// What else a Hugging Face export hands `attn run`: one BertLayer's or one
// BertAttention's state dict (no layer number: --layer left out), a BertEncoder's
// (layer.N.), another model's leading name (roberta.).
TEST_F(CliTest, CheckpointsOfOneLayerAnEncoderOrAnotherModelLoad) {
    const TinyBert bert("", 2);
    auto renamed = [&](const std::string &from, const std::string &to) {
        TinyBert t = bert;
        t.tensors.clear();
        for (const auto &[name, tensor] : bert.tensors) {
            if (name.rfind(from, 0) == 0) t.tensors[to + name.substr(from.size())] = tensor;
        }
        return t;
    };
    const std::string layer1 = "encoder.layer.1.attention.";
    const std::vector<float> &w_v = bert.values.at(layer1 + "self.value.weight");
    const std::vector<float> &beta = bert.values.at(layer1 + "output.LayerNorm.bias");
    const struct {
        std::string dir, prefix;
        std::optional<int> layer;
    } cases[] = {{"bert_layer", "attention.", std::nullopt},  // BertLayer.state_dict()
                 {"bert_attention", "", std::nullopt},        // BertAttention.state_dict()
                 {"bert_encoder", "layer.1.attention.", 1},   // BertEncoder.state_dict()
                 {"roberta", "roberta.encoder.layer.1.attention.", 1}};
    for (const auto &c : cases) {
        renamed(layer1, c.prefix).write(path(c.dir));
        const CheckpointLayer layer = load_bert_layer(path(c.dir), c.layer, std::nullopt, std::nullopt);
        EXPECT_EQ(layer.prefix, c.prefix) << c.dir;
        EXPECT_EQ(layer.w_v, w_v) << c.dir;
        EXPECT_EQ(layer.beta, beta) << c.dir;
    }
    // attn run on one layer's checkpoint, --layer left out.
    write_npy(path("x_one.npy"), {1, 3, 8}, std::vector<float>(24, 0.5f), "x");
    const Result r =
        attn("run --model " + path("bert_layer") + " --input " + path("x_one.npy") + " --output " + path("y_one.npy"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output.rfind("attention: ", 0), 0u) << r.output;
    EXPECT_EQ(read_npy(path("y_one.npy"), "y").shape, (Shape{1, 3, 8}));
    // Without --layer, a model's layer 0.
    TinyBert("roberta.").write(path("roberta_model"));
    EXPECT_EQ(load_bert_layer(path("roberta_model"), std::nullopt, std::nullopt, std::nullopt).prefix,
              "roberta.encoder.layer.0.attention.");
}

TEST_F(CliTest, CheckpointProblemsNameTheArgumentAndTheTensor) {
    auto expect_error = [&](const std::string &what, auto load, const std::string &argument, const std::string &text) {
        try {
            load();
            ADD_FAILURE() << what << ": accepted";
        } catch (const Error &e) {
            EXPECT_EQ(e.argument(), argument) << what << ": " << e.what();
            EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << what << ": " << e.what();
        }
    };
    const TinyBert bert;
    bert.write(path("ok"));
    expect_error(
        "no such path", [&] { load_bert_layer(path("nope"), 0, 2, std::nullopt); }, "--model", "does not exist");
    expect_error(
        "directory without weights", [&] { load_bert_layer(dir_.string(), 0, 2, std::nullopt); }, "--model",
        "has no model.safetensors");
    expect_error(
        "missing layer", [&] { load_bert_layer(path("ok"), 2, std::nullopt, std::nullopt); }, "--layer",
        "2 is not in the checkpoint, which has layers 0 to 1");
    bert.write(path("no_config"), "");
    expect_error(
        "no heads", [&] { load_bert_layer(path("no_config"), 0, std::nullopt, std::nullopt); }, "--heads",
        "there is no config.json");
    bert.write(path("bad_config"), "{\"num_attention_heads\": \"twelve\"}");
    expect_error(
        "heads not a number", [&] { load_bert_layer(path("bad_config"), 0, std::nullopt, std::nullopt); }, "--model",
        "'num_attention_heads' is \"twelve\", not a number");
    bert.write(path("wrong_hidden"), "{\"num_attention_heads\": 2, \"hidden_size\": 16}");
    expect_error(
        "config disagrees", [&] { load_bert_layer(path("wrong_hidden"), 0, std::nullopt, std::nullopt); }, "--model",
        "hidden_size 16 disagrees with the checkpoint's 8");

    TinyBert missing = bert;
    missing.tensors.erase("bert.encoder.layer.0.attention.self.key.bias");
    missing.write(path("missing"));
    expect_error(
        "missing tensor", [&] { load_bert_layer(path("missing"), 0, std::nullopt, std::nullopt); }, "--model",
        "no tensor 'bert.encoder.layer.0.attention.self.key.bias'");

    TinyBert wrong = bert;
    wrong.tensors["bert.encoder.layer.0.attention.self.value.weight"] = f32(std::vector<float>(32), {8, 4});
    wrong.write(path("wrong"));
    expect_error(
        "wrong shape", [&] { load_bert_layer(path("wrong"), 0, std::nullopt, std::nullopt); }, "--model",
        "'bert.encoder.layer.0.attention.self.value.weight' has shape [8, 4], expected [8, 8]");

    TinyBert ints = bert;
    ints.tensors["bert.encoder.layer.0.attention.self.key.bias"] = {"I32", {8}, std::string(32, '\0')};
    ints.write(path("ints"));
    expect_error(
        "integer weights", [&] { load_bert_layer(path("ints"), 0, std::nullopt, std::nullopt); },
        "--model tensor 'bert.encoder.layer.0.attention.self.key.bias'", "got int32");

    TinyBert twice = bert;
    for (const auto &[name, t] : bert.tensors) twice.tensors["other." + name.substr(5)] = t;
    twice.write(path("twice"));
    expect_error(
        "ambiguous", [&] { load_bert_layer(path("twice"), 0, std::nullopt, std::nullopt); }, "--model", "is ambiguous");

    // A checkpoint of one layer has no layer numbers; one without layer 0 needs --layer.
    TinyBert one_layer = bert;
    one_layer.tensors.clear();
    for (const auto &[name, t] : bert.tensors) {
        const std::string layer0 = "bert.encoder.layer.0.";
        if (name.rfind(layer0, 0) == 0) one_layer.tensors[name.substr(layer0.size())] = t;
    }
    one_layer.write(path("one_layer"));
    expect_error(
        "--layer for one layer", [&] { load_bert_layer(path("one_layer"), 0, std::nullopt, std::nullopt); }, "--layer",
        "holds one attention layer without a layer number ('attention.'); leave --layer out");
    TinyBert no_layer0 = bert;
    for (const auto &[name, t] : bert.tensors) {
        if (name.rfind("bert.encoder.layer.0.", 0) == 0) no_layer0.tensors.erase(name);
    }
    no_layer0.write(path("no_layer0"));
    expect_error(
        "no layer 0 and no --layer",
        [&] { load_bert_layer(path("no_layer0"), std::nullopt, std::nullopt, std::nullopt); }, "--model",
        "has no layer 0 (its layers are 1 to 1): name one with --layer");
    fs::create_directories(path("sharded"));
    write_file(path("sharded/model.safetensors.index.json"), "{}");
    expect_error(
        "sharded", [&] { load_bert_layer(path("sharded"), std::nullopt, 2, std::nullopt); }, "--model",
        "holds a sharded checkpoint");
    fs::create_directories(path("pickle"));
    write_file(path("pickle/pytorch_model.bin"), "PK");
    expect_error(
        "pickle", [&] { load_bert_layer(path("pickle"), std::nullopt, 2, std::nullopt); }, "--model",
        "holds pytorch_model.bin");

    write_file(path("empty.safetensors"), safetensors_file({{"x", f32({1}, {1})}}));
    expect_error(
        "not BERT", [&] { load_bert_layer(path("empty.safetensors"), 0, 2, std::nullopt); }, "--model",
        "no BERT attention layers");
}

// ---- the attn executable ----

TEST_F(CliTest, RunMatchesTheReferenceAndWritesProbabilities) {
    const TinyBert bert;
    bert.write(path("model"));
    const CheckpointLayer layer = load_bert_layer(path("model"), 1, std::nullopt, std::nullopt);
    const int64_t batch = 2, seq = 5;
    std::vector<float> x(batch * seq * 8);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal;
    for (float &e : x) e = normal(rng);
    write_npy(path("x.npy"), {batch, seq, 8}, x, "x");
    const uint8_t mask[] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    write_file(path("mask.npy"), npy_file(npy_header("|b1", "(2, 5)"), raw(mask, 10)));

    const Result r = attn("run --model " + path("model") + " --layer 1 --input " + path("x.npy") + " --mask " +
                          path("mask.npy") + " --output " + path("y.npy") + " --probs " + path("p.npy"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("bert.encoder.layer.1.attention"), std::string::npos) << r.output;

    AttentionInputs inputs;
    inputs.x = {x.data(), x.size(), {batch, seq, 8}};
    inputs.key_padding_mask = {mask, 10, {batch, seq}};
    const auto exact = reference::attention_layer<double>(layer.config, layer.weights(), inputs);
    const auto plain = reference::attention_layer<float>(layer.config, layer.weights(), inputs);
    const Array y = read_npy(path("y.npy"), "y"), p = read_npy(path("p.npy"), "p");
    ASSERT_EQ(y.shape, (Shape{batch, seq, 8}));
    ASSERT_EQ(p.shape, (Shape{batch, 2, seq, seq}));
    const auto y_values = to_float32(y, "y"), p_values = to_float32(p, "p");
    const auto y_accuracy = testing::check_accuracy(y_values.data(), exact.y, plain.y);
    const auto p_accuracy = testing::check_accuracy(p_values.data(), exact.probs, plain.probs);
    EXPECT_TRUE(y_accuracy.ok) << y_accuracy.report("y");
    EXPECT_TRUE(p_accuracy.ok) << p_accuracy.report("probs");
    EXPECT_EQ(p_values[(1 * 2 + 0) * 25 + 0 * 5 + 4], 0.0f) << "padded key 4 of sequence 1 gets no attention";
    // On one thread, bit for bit the same (a parallel loop splits the work, not a sum).
    const Result one =
        attn("run --threads 1 --model " + path("model") + " --layer 1 --input " + path("x.npy") + " --mask " +
             path("mask.npy") + " --output " + path("y1.npy") + " --probs " + path("p1.npy"));
    ASSERT_EQ(one.status, 0) << one.output;
    EXPECT_EQ(read_npy(path("y1.npy"), "y").bytes, y.bytes);
    EXPECT_EQ(read_npy(path("p1.npy"), "p").bytes, p.bytes);
}

TEST_F(CliTest, RunPackedComputesRealTokensAndZerosPadding) {
    const TinyBert bert;
    bert.write(path("model"));
    const CheckpointLayer layer = load_bert_layer(path("model"), 1, std::nullopt, std::nullopt);
    const int64_t batch = 3, seq = 5;
    std::vector<float> x(batch * seq * 8);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    for (float &e : x) e = normal(rng);
    write_npy(path("x.npy"), {batch, seq, 8}, x, "x");
    const uint8_t mask[] = {1, 1, 1, 0, 0, /**/ 1, 1, 1, 1, 1, /**/ 1, 0, 0, 0, 0};
    write_file(path("mask.npy"), npy_file(npy_header("|b1", "(3, 5)"), raw(mask, 15)));

    const Result r = attn("run --packed --model " + path("model") + " --layer 1 --input " + path("x.npy") +
                          " --mask " + path("mask.npy") + " --output " + path("y.npy") + " --probs " + path("p.npy"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("packed"), std::string::npos) << r.output;

    // Real rows and their probabilities as the dense reference computes them; padding zeros.
    AttentionInputs inputs;
    inputs.x = {x.data(), x.size(), {batch, seq, 8}};
    inputs.key_padding_mask = {mask, 15, {batch, seq}};
    auto exact = reference::attention_layer<double>(layer.config, layer.weights(), inputs);
    auto plain = reference::attention_layer<float>(layer.config, layer.weights(), inputs);
    for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < seq; ++i) {
            if (mask[b * seq + i]) continue;
            for (int64_t o = 0; o < 8; ++o) exact.y[std::size_t((b * seq + i) * 8 + o)] = plain.y[std::size_t((b * seq + i) * 8 + o)] = 0;
            for (int64_t h = 0; h < 2; ++h)
                for (int64_t j = 0; j < seq; ++j) {
                    const std::size_t at = std::size_t(((b * 2 + h) * seq + i) * seq + j);
                    exact.probs[at] = plain.probs[at] = 0;
                }
        }
    const Array y = read_npy(path("y.npy"), "y"), p = read_npy(path("p.npy"), "p");
    ASSERT_EQ(y.shape, (Shape{batch, seq, 8}));
    ASSERT_EQ(p.shape, (Shape{batch, 2, seq, seq}));
    const auto y_values = to_float32(y, "y"), p_values = to_float32(p, "p");
    const auto y_accuracy = testing::check_accuracy(y_values.data(), exact.y, plain.y);
    const auto p_accuracy = testing::check_accuracy(p_values.data(), exact.probs, plain.probs);
    EXPECT_TRUE(y_accuracy.ok) << y_accuracy.report("y");
    EXPECT_TRUE(p_accuracy.ok) << p_accuracy.report("probs");
    EXPECT_EQ(y_values[(2 * seq + 3) * 8], 0.0f) << "padded row 3 of sequence 2 is zero";
}

TEST_F(CliTest, RunRefusesBadInputsWithAMessageAndNonZeroExit) {
    const TinyBert bert;
    bert.write(path("model"));
    write_npy(path("x.npy"), {1, 3, 8}, std::vector<float>(24, 0.5f), "x");
    write_npy(path("x_h6.npy"), {1, 3, 6}, std::vector<float>(18, 0.5f), "x");
    const double x64[24] = {};
    write_file(path("x64.npy"), npy_file(npy_header("<f8", "(1, 3, 8)"), raw(x64, sizeof x64)));
    const uint8_t mask[] = {1, 0};
    write_file(path("mask_short.npy"), npy_file(npy_header("|b1", "(1, 2)"), raw(mask, 2)));
    const std::string model = " --model " + path("model"), out = " --output " + path("y.npy");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {model + " --input " + path("x64.npy") + out,
         "--input: " + path("x64.npy") + ": expected float32 [batch, seq, 8], got float64"},
        {model + " --input " + path("x_h6.npy") + out, "expected x of shape [batch, seq, 8]"},
        {model + " --input " + path("missing.npy") + out, "--input: cannot open"},
        {model + " --input " + path("x.npy") + " --mask " + path("mask_short.npy") + out,
         "--mask: " + path("mask_short.npy") + ": expected shape [1, 3]"},
        {model + " --input " + path("x.npy") + " --variant no_such_variant" + out, "variant"},
        {model + " --input " + path("x.npy") + " --heads 3" + out, "num_heads"},
        {model + " --input " + path("x.npy") + " --layer 4" + out, "--layer: 4 is not in the checkpoint"},
        {model + " --input " + path("x.npy") + " --output " + path("no_dir/y.npy"), "--output: cannot write"},
    };
    // --threads 1 gives the same output as the default.
    for (const auto &[args, message] : cases) {
        const Result r = attn("run" + args);
        EXPECT_EQ(r.status, 1) << args << "\n" << r.output;
        EXPECT_NE(r.output.find("attn run: error: "), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in: " << r.output;
    }
    const Result usage = attn("run --input " + path("x.npy"));
    EXPECT_NE(usage.status, 0);
    EXPECT_NE(usage.output.find("--model is required"), std::string::npos) << usage.output;
}

TEST_F(CliTest, HeatmapWritesPngsPerHeadOrAsAGrid) {
    std::vector<float> probs(1 * 3 * 4 * 4, 0.25f);
    write_npy(path("p.npy"), {1, 3, 4, 4}, probs, "p");
    write_file(path("tokens.txt"), "[CLS]\nit\nwas\n[SEP]\n");
    const std::string png_magic = "\x89PNG\r\n\x1a\n";
    auto is_png = [&](const std::string &file) {
        std::ifstream in(file, std::ios::binary);
        std::string head(8, '\0');
        in.read(head.data(), 8);
        return head == png_magic;
    };
    Result r = attn("heatmap --probs " + path("p.npy") + " --tokens " + path("tokens.txt") + " --out " + path("heads"));
    ASSERT_EQ(r.status, 0) << r.output;
    for (int h = 0; h < 3; ++h) EXPECT_TRUE(is_png(path("heads/batch0_head0" + std::to_string(h) + ".png"))) << h;
    r = attn("heatmap --probs " + path("p.npy") + " --grid --title grid --out " + path("grid.png"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(is_png(path("grid.png")));
    r = attn("heatmap --probs " + path("p.npy") + " --head 1 --highlight-query 1 --out " + path("one.png"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_TRUE(is_png(path("one.png")));

    const std::vector<std::pair<std::string, std::string>> bad = {
        {" --head 3", "--head: 3 is outside [0, 3)"},
        {" --batch 1", "--batch: 1 is outside [0, 1)"},
        {" --highlight-query 9", "--highlight-query: 9 is outside [0, 4)"},
    };
    for (const auto &[args, message] : bad) {
        r = attn("heatmap --probs " + path("p.npy") + args + " --out " + path("x.png"));
        EXPECT_EQ(r.status, 1) << r.output;
        EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
    }
    write_file(path("three.txt"), "a\nb\nc\n");
    r = attn("heatmap --probs " + path("p.npy") + " --tokens " + path("three.txt") + " --out " + path("x.png"));
    EXPECT_NE(r.output.find("has 3 lines, but the probabilities cover 4 tokens"), std::string::npos) << r.output;
    write_npy(path("flat.npy"), {16}, std::vector<float>(16), "p");
    r = attn("heatmap --probs " + path("flat.npy") + " --out " + path("x.png"));
    EXPECT_NE(r.output.find("expected probabilities [batch, heads, S_q, S_k], got [16]"), std::string::npos)
        << r.output;
}

TEST_F(CliTest, VariantsListsEveryCompiledVariant) {
    const Result r = attn("variants --json");
    ASSERT_EQ(r.status, 0) << r.output;
    const json list = json::parse(r.output);
    ASSERT_EQ(list.size(), variants().size());
    for (std::size_t i = 0; i < list.size(); ++i) {
        EXPECT_EQ(list[i]["name"], variants()[i].name);
        EXPECT_EQ(list[i]["target"], variants()[i].target);
        EXPECT_EQ(list[i]["runnable"], variants()[i].runnable);
    }
    const Result table = attn("variants");
    EXPECT_NE(table.output.find("selected on this machine: " + select_variant().name), std::string::npos);
}

TEST_F(CliTest, BenchChecksAndTimesTheChosenVariants) {
#ifdef ATTN_VARIANT_SUBSET
    GTEST_SKIP() << "built with ATTN_ONLY_VARIANTS: manual_sse41 and autotuned_sse41 may not be there";
#endif
    const Result r = attn("bench --problem b1_s128_h384_n12 --variants '^(manual|autotuned)_sse41$' --rounds 3");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("3 interleaved rounds"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("manual_sse41               ok"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("autotuned_sse41            ok"), std::string::npos) << r.output;
    // One of the two is the best; the other is given a paired ratio with its interval.
    EXPECT_NE(r.output.find("  best\n"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("x ["), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("kernels on one thread per CPU core"), std::string::npos) << r.output;
    const Result one = attn("bench --problem b1_s128_h384_n12 --variants '^manual_sse41$' --repetitions 2 --threads 1");
    EXPECT_EQ(one.status, 0) << one.output;
    EXPECT_NE(one.output.find("kernels on 1 threads"), std::string::npos) << one.output;
    const Result zero = attn("bench --problem b1_s128_h384_n12 --threads 0");
    EXPECT_NE(zero.status, 0);
    EXPECT_NE(zero.output.find("--threads"), std::string::npos) << zero.output;
    const Result unknown = attn("bench --problem b9_nope");
    EXPECT_EQ(unknown.status, 1);
    EXPECT_NE(unknown.output.find("--problem: unknown problem 'b9_nope'; known: b1_s128_h768_n12_pad"),
              std::string::npos)
        << unknown.output;
    const Result regex = attn("bench --variants '(('");
    EXPECT_NE(regex.output.find("--variants: '((' is not a regular expression"), std::string::npos) << regex.output;
}

TEST_F(CliTest, GenerateRefusesUnknownSchedulesAndTargets) {
    Result r = attn("generate --target arm-64-linux --schedule best --out " + path("out"));
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--schedule: unknown schedule source 'best'; manifest.json has manual, mullapudi2016"),
              std::string::npos)
        << r.output;
    r = attn("generate --target not-a-target --schedule manual --out " + path("out"));
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--target: attn_generators failed on attn_"), std::string::npos) << r.output;
}

// A schedule source that cannot schedule a function on the target's ISA leaves it out, as
// the build does (manifest.json: not_provided): Li2018 has no packed layer on x86.
TEST_F(CliTest, GenerateLeavesOutWhatTheSourceCannotProvideOnTheTarget) {
    const Result r = attn("generate --dry-run --target x86-64-linux-avx2-fma-f16c --schedule li2018 --out " +
                          path("dry"));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("leaving out attention_layer_packed: schedule li2018 cannot provide it on avx2"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("would generate attn_attention_layer_li2018_"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("would generate attn_attention_layer_packed_li2018_"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(path("dry"))) << "a dry run wrote its output folder";
    // On arm64 the hand-written schedule provides every fp32 function; bf16 and int8 are built
    // for x86 (built_for).
    const Result manual = attn("generate --dry-run --target arm-64-linux --schedule manual --out " + path("dry"));
    std::istringstream lines(manual.output);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("leaving out ", 0) == 0)
            EXPECT_TRUE(line.find("_bf16: ") != std::string::npos || line.find("_int8: ") != std::string::npos)
                << line;
    }
}

// --functions keeps the functions whose name it matches, and says what is wrong with a
// pattern that is no regular expression or matches nothing.
TEST_F(CliTest, GenerateOnlyTheFunctionsAsked) {
    Result r = attn("generate --dry-run --target arm-64-linux --schedule manual --functions '^attention_(core|scores)$' "
                    "--out " + path("dry"));
    EXPECT_EQ(r.status, 0) << r.output;
    std::istringstream lines(r.output);
    std::vector<std::string> generated;
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("would generate ", 0) == 0) generated.push_back(line.substr(15));
    EXPECT_EQ(generated, (std::vector<std::string>{"attn_attention_scores_manual_arm_64_linux",
                                                   "attn_attention_core_manual_arm_64_linux", "attn_halide_runtime"}))
        << r.output;
    r = attn("generate --dry-run --target arm-64-linux --schedule manual --functions '((' --out " + path("dry"));
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--functions: '((' is not a regular expression"), std::string::npos) << r.output;
    r = attn("generate --dry-run --target arm-64-linux --schedule manual --functions '^layer$' --out " + path("dry"));
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find("--functions: '^layer$' matches none of the functions schedule manual provides on arm64"),
              std::string::npos)
        << r.output;
}

}  // namespace
}  // namespace attn::cli
