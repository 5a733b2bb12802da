// meshtrain matrix: the parity matrix (train/parity_matrix.h) as Markdown:
// each feature on each mesh axis, tested equal to one process (the test) or
// refused before start (the error).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "meshtrain/train/parity_matrix.h"

namespace meshtrain::cli {

Run add_matrix(CLI::App& app) {
  app.add_subcommand("matrix", "print the parity matrix: every feature x mesh axis, tested or refused");
  return []() {
    fmt::print("{}", matrix_markdown());
    return 0;
  };
}

}  // namespace meshtrain::cli
