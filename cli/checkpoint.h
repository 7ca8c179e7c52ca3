// One BERT self-attention layer from a Hugging Face checkpoint: model.safetensors
// (a file, or a directory holding it and config.json) with BERT's tensor names
//   <P>self.{query,key,value}.{weight,bias}
//   <P>output.dense.{weight,bias}
//   <P>output.LayerNorm.{weight,bias}   (older checkpoints: LayerNorm.{gamma,beta})
// where the attention module's prefix <P> is [<leading name>.]encoder.layer.<N>.attention.
// in a model (bert., roberta., ... or none), layer.<N>.attention. in an encoder alone,
// attention. in one layer alone, and empty in one BertAttention alone.
// fp16/bf16/fp64 tensors become float32.
#pragma once

#include "attn/attention.h"

#include <optional>
#include <string>
#include <vector>

namespace attn::cli {

struct CheckpointLayer {
    std::string safetensors_path, config_path;  // config_path empty when none was found
    std::string prefix;                         // the attention module's, e.g. "encoder.layer.3.attention."
    Config config;
    std::vector<float> w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, gamma, beta;

    LayerWeights weights() const;  // views over the vectors above
};

// `layer` picks layer N (default 0) of a model or encoder; a checkpoint of one layer or
// one attention module has no layer numbers and takes none. `heads` and `eps` override
// config.json; without either, loading fails naming --heads.
CheckpointLayer load_bert_layer(const std::string &model_path, std::optional<int> layer, std::optional<int64_t> heads,
                                std::optional<float> eps);

}  // namespace attn::cli
