// Rank discovery from torchrun-style, Slurm and OpenMPI variables, and the
// errors for incomplete sets.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <sstream>
#include <thread>

#include "meshtrain/runtime/env.h"
#include "meshtrain/runtime/runtime.h"

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

// A task of an srun step reads the step's variables: `srun -n4` without --ntasks-per-node
// (no SLURM_NTASKS_PER_NODE) works, and a step using part of the allocation (SLURM_NTASKS 8,
// the step 3 tasks over 2 nodes) counts its own ranks.
TEST(Env, Slurm) {
  DistEnv e = from({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "3"}, {"SLURM_LOCALID", "0"},
                    {"SLURM_NODEID", "1"}, {"SLURM_STEP_TASKS_PER_NODE", "2,1"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"}});
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.local_rank, 0);
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  e = from({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "3"},
            {"SLURM_NODEID", "0"}, {"SLURM_STEP_TASKS_PER_NODE", "4"}, {"SLURM_STEP_NODELIST", "localhost"}});
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "localhost");
  EXPECT_EQ(slurm_tasks_on_node("V", "3", 0), 3);
  EXPECT_EQ(slurm_tasks_on_node("V", "2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("V", "2(x3),1", 3), 1);
  EXPECT_THROW(slurm_tasks_on_node("V", "2(x3),1", 4), std::invalid_argument);
  EXPECT_THROW(slurm_tasks_on_node("V", "2(x3", 0), std::invalid_argument);
  // Without MASTER_ADDR, rank 0's host is the step's first node, not the host srun ran on.
  e = from({{"SLURM_PROCID", "6"}, {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "2"}, {"SLURM_NODEID", "1"},
            {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.0.0.1"},
            {"SLURM_JOB_NODELIST", "gpu[007-009],cpu1"}});
  EXPECT_EQ(e.master_addr, "gpu007");
  EXPECT_EQ(e.local_world_size, 4);
  // An sbatch script outside any step: SLURM_PROCID 0 of SLURM_NTASKS 4, but it is no rank.
  e = from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "0"}, {"SLURM_JOB_NODELIST", "n1"}});
  EXPECT_EQ(e.world_size, 1);
  EXPECT_FALSE(e.distributed());
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
  EXPECT_NE(error_of({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "0"}})
                .find("SLURM_STEP_TASKS_PER_NODE is missing"),
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
// The local addresses (hex, as /proc/net/tcp{,6} print them) of sockets listening on `port`.
std::vector<std::string> listening_on(int port) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string sl, local, remote, state;
      in >> sl >> local >> remote >> state;
      const size_t colon = local.rfind(':');
      if (state == "0A" && std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local.substr(0, colon));
    }
  }
  return out;
}

// Rank 0 of a multi-host job serves the rendezvous store on the master address only: a job
// on 127.0.0.1 listens on loopback, not on every interface (0.0.0.0) where any host reaches it.
TEST(Env, TheStoreListensOnTheMasterAddressOnly) {
  const int probe = socket(AF_INET, SOCK_STREAM, 0);  // a free port
  sockaddr_in a{};
  a.sin_family = AF_INET;
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  close(probe);
  DistEnv e;
  e.source = "launch";
  e.rank = 0;
  e.world_size = 2;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  RuntimeOptions o;
  o.timeout = std::chrono::seconds(3);  // rank 1 never comes: rank 0 gives up after this
  o.configure_threads = false;
  auto rank0 = std::async(std::launch::async, [&] {
    try {
      Runtime::init(e, o);
    } catch (const std::exception&) {
    }
  });
  std::vector<std::string> seen;
  for (int i = 0; i < 200 && seen.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = listening_on(port);
  }
  rank0.get();
  ASSERT_FALSE(seen.empty()) << "rank 0 never listened on port " << port;
  for (const auto& addr : seen) EXPECT_EQ(addr, "0100007F") << "listening on " << addr << ", not 127.0.0.1 alone";
}

}  // namespace meshtrain
