// Where this process stands in the job: rank, world size, local rank and the
// rendezvous address, read from the variables a launcher sets.
//
// Accepted sources, in this order:
//   meshtrain launch / torchrun: RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
//   Slurm (srun):               SLURM_PROCID SLURM_NTASKS SLURM_LOCALID SLURM_NTASKS_PER_NODE
//                               (+ MASTER_ADDR, or SLURM_LAUNCH_NODE_IPADDR)
//   OpenMPI (mpirun):           OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE
//                               OMPI_COMM_WORLD_LOCAL_RANK OMPI_COMM_WORLD_LOCAL_SIZE (+ MASTER_ADDR)
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // "launch", "slurm", "openmpi" or "single"
  int restart = 0;                 // MESHTRAIN_RESTART_COUNT / TORCHELASTIC_RESTART_COUNT: restarts so far
  // MESHTRAIN_STORE_FILE: the rendezvous store is this file (a job on one host,
  // started by meshtrain launch): no TCP listener at all. "" = the TCP store on
  // MASTER_ADDR:MASTER_PORT.
  std::string store_file;

  bool distributed() const { return source != "single"; }

  // Reads the variables through `getenv` (replaceable for tests). Returns a
  // single-process environment when no launcher set anything; throws
  // std::invalid_argument naming the variable when the set is incomplete or wrong.
  static DistEnv from_environment(
      const std::function<std::optional<std::string>(const std::string&)>& getenv = {});
};

// Slurm's task counts per node ("4", "4(x2)", "4(x2),3": 4 4 3) -> the count of node `node`
// (SLURM_NODEID). `name` is the variable it came from, for the error.
int slurm_tasks_on_node(const std::string& name, const std::string& value, int node);
// Expands a Slurm node list: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5
// (zero padding kept; several bracket groups in one name expand in turn).
// Under Slurm without MASTER_ADDR, rank 0's host is the first of SLURM_JOB_NODELIST.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

}  // namespace meshtrain
