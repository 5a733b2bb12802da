// meshtrain mesh --world N --mesh tp=2,pp=2 [--order ...] [--ranks-per-node K]: print a layout.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <memory>

#include "cli/commands.h"
#include "meshtrain/runtime/mesh.h"

namespace meshtrain::cli {

Run add_mesh(CLI::App& app) {
  struct Opts {
    int world = 1;
    std::string mesh, order;
    int per_node = 8;
  };
  auto o = std::make_shared<Opts>();
  auto cmd = app.add_subcommand("mesh", "print the rank layout of a mesh (no processes started)");
  cmd->add_option("--world", o->world, "number of ranks")->required();
  cmd->add_option("--mesh", o->mesh, "axis sizes, e.g. tp=2,pp=2 (dp inferred)");
  cmd->add_option("--order", o->order, "axes fastest first (default tp,cp,ep,dp,pp)");
  cmd->add_option("--ranks-per-node", o->per_node, "ranks on one node");
  return [o]() {
    auto layout = MeshLayout::create(o->world, MeshLayout::parse(o->mesh), MeshLayout::parse_order(o->order));
    fmt::print("{}", layout.table(o->per_node, 1 << 20));
    return 0;
  };
}

}  // namespace meshtrain::cli
