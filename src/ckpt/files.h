// Small file-system helpers of the checkpoint code (internal).
#pragma once

#include <cstdint>
#include <string>

namespace meshtrain::ckpt {

// Writes `text` to path.tmp, fsyncs, renames onto `path`.
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);
void fsync_dir(const std::string& dir);

}  // namespace meshtrain::ckpt
