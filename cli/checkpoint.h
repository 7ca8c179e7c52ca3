// One BERT self-attention layer from a Hugging Face checkpoint: model.safetensors
// (a file, or a directory holding it and config.json) with BERT's tensor names
//   [<leading name>.]encoder.layer.<N>.attention.self.{query,key,value}.{weight,bias}
//   [<leading name>.]encoder.layer.<N>.attention.output.dense.{weight,bias}
//   [<leading name>.]encoder.layer.<N>.attention.output.LayerNorm.{weight,bias}
// (older checkpoints: LayerNorm.{gamma,beta}). fp16/bf16/fp64 tensors become float32.
#pragma once

#include "attn/attention.h"

#include <optional>
#include <string>
#include <vector>

namespace attn::cli {

struct CheckpointLayer {
    std::string safetensors_path, config_path;  // config_path empty when none was found
    std::string prefix;                         // e.g. "encoder.layer.3."
    Config config;
    std::vector<float> w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, gamma, beta;

    LayerWeights weights() const;  // views over the vectors above
};

// `heads` and `eps` override config.json; without either, loading fails naming --heads.
CheckpointLayer load_bert_layer(const std::string &model_path, int layer, std::optional<int64_t> heads,
                                std::optional<float> eps);

}  // namespace attn::cli
