// Internal: the dropout sites of a transformer layer (nn::DropoutKeys::key's
// second name), shared by the model (model/transformer.cpp: the embedding's)
// and its blocks (model/block.cpp). Masks are keyed by (layer, site), so a
// recomputed forward draws the masks the first one drew.
#pragma once

#include <cstdint>

namespace meshtrain {

enum DropoutSite : uint64_t { kEmbedding = 1, kAttentionProbs = 2, kAttentionOut = 3, kMlpOut = 4 };

}  // namespace meshtrain
