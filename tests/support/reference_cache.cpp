#include "variant_param.h"

#include <map>
#include <memory>
#include <mutex>

namespace attn::testing {

const ReferenceRun &reference_run(const LayerData &data) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<ReferenceRun>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto &slot = cache[data.problem.name()];
    if (!slot) {
        const Config config = data.problem.config();
        slot = std::make_unique<ReferenceRun>(
            ReferenceRun{reference::attention_layer<double>(config, data.weights(), data.inputs()),
                         reference::attention_layer<float>(config, data.weights(), data.inputs())});
    }
    return *slot;
}

const PackedReferenceRun &packed_reference_run(const std::string &key, const Config &config,
                                               const LayerWeights &weights, const PackedInputs &inputs) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<PackedReferenceRun>> cache;
    std::lock_guard<std::mutex> lock(mutex);
    auto &slot = cache[key];
    if (!slot) {
        slot = std::make_unique<PackedReferenceRun>(
            PackedReferenceRun{reference::attention_layer_packed<double>(config, weights, inputs),
                               reference::attention_layer_packed<float>(config, weights, inputs)});
    }
    return *slot;
}

}  // namespace attn::testing
