// Rank discovery from torchrun-style, Slurm and OpenMPI variables, and the
// errors for incomplete sets.
#include <gtest/gtest.h>

#include <map>

#include "meshtrain/runtime/env.h"

namespace meshtrain {
namespace {

DistEnv from(const std::map<std::string, std::string>& vars) {
  return DistEnv::from_environment([&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
}

std::string error_of(const std::map<std::string, std::string>& vars) {
  try {
    from(vars);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Env, NothingSetIsOneProcess) {
  DistEnv e = from({});
  EXPECT_FALSE(e.distributed());
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
}

TEST(Env, LauncherVariables) {
  DistEnv e = from({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                    {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(e.source, "launch");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 1234);
}

TEST(Env, Slurm) {
  DistEnv e = from({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                    {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"}});
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(parse_slurm_tasks_per_node("3"), 3);
  EXPECT_EQ(parse_slurm_tasks_per_node("2(x3),1"), 2);
  // Without MASTER_ADDR, rank 0's host is the job's first node, not the host srun ran on.
  e = from({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "4"},
            {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"}, {"SLURM_JOB_NODELIST", "gpu[007-009],cpu1"}});
  EXPECT_EQ(e.master_addr, "gpu007");
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07]"), (std::vector<std::string>{"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(expand_slurm_nodelist("a1,b[8-10]-ib,r[1-2]n[1-2]"),
            (std::vector<std::string>{"a1", "b8-ib", "b9-ib", "b10-ib", "r1n1", "r1n2", "r2n1", "r2n2"}));
  for (const char* bad : {"node[01-", "node[3-1]", "node[a-b]", "node]"}) {
    EXPECT_THROW(expand_slurm_nodelist(bad), std::invalid_argument) << bad;
  }
}

TEST(Env, OpenMpiOnOneNodeNeedsNoMasterAddr) {
  DistEnv e = from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(e.source, "openmpi");
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_NE(error_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("MASTER_ADDR"),
            std::string::npos);
}

TEST(Env, MissingVariablesAreNamed) {
  EXPECT_NE(error_of({{"RANK", "0"}}).find("WORLD_SIZE is missing"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is missing"), std::string::npos);
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}})
                .find("SLURM_NTASKS_PER_NODE"),
            std::string::npos);
}

TEST(Env, BadValuesAreNamed) {
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}}).find("not below world size"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "-5"}})
                .find("MASTER_PORT"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain
