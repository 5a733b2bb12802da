// Several hosts on one machine, for real: each "host" is a network namespace with its own
// address (a veth pair joins them) and its own hostname (a UTS namespace, so the ranks do
// not take each other for neighbours and share no memory), and runs its own
// `meshtrain launch --nnodes 2 --node-rank i`. Needs root and `ip netns`; skipped with the
// reason where namespaces cannot be made.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/run_command.h"
#include "tests/train_cli.h"
#include "tests/test_paths.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using test::run_command;

// Two namespaces, 10.77.0.1 (host 0) and 10.77.0.2 (host 1), joined by a veth pair; removed
// (with the pair) on destruction.
class Hosts {
 public:
  Hosts() {
    const std::string id = std::to_string(getpid());
    for (int h = 0; h < 2; ++h) {
      ns_[h] = "mt" + id + (h ? "b" : "a");
      dev_[h] = "mtv" + id + (h ? "b" : "a");
    }
    const auto r = run_command("ip netns add " + ns_[0] + " && ip netns add " + ns_[1] + " && ip link add " + dev_[0] +
                               " type veth peer name " + dev_[1] + " && ip link set " + dev_[0] + " netns " + ns_[0] +
                               " && ip link set " + dev_[1] + " netns " + ns_[1] + " && " + setup(0) + " && " + setup(1));
    if (r.code != 0) why_ = r.output.empty() ? "ip failed" : r.output;
  }
  ~Hosts() { run_command("ip netns del " + ns_[0] + "; ip netns del " + ns_[1]); }
  const std::string& why() const { return why_; }  // "" when the hosts exist
  std::string address(int h) const { return h ? "10.77.0.2" : "10.77.0.1"; }
  // A shell command that runs `script` (a file) on host h with hostname nodeH, Gloo on its link
  // and the job token `token` (none when empty).
  std::string on(int h, const std::string& script, const std::string& token = kToken) const {
    return "ip netns exec " + ns_[h] + " unshare -u sh -c 'hostname node" + std::to_string(h) + " && " +
           (token.empty() ? "" : "MESHTRAIN_JOB_TOKEN=" + token + " ") + "GLOO_SOCKET_IFNAME=" + dev_[h] +
           " exec sh " + script + "'";
  }
  static constexpr const char* kToken = "multihost-test-token-0123";
  std::string link_down(int h) const { return "ip -n " + ns_[h] + " link set " + dev_[h] + " down"; }
  std::string link_up(int h) const { return "ip -n " + ns_[h] + " link set " + dev_[h] + " up"; }
  std::string in_ns(int h, const std::string& cmd) const { return "ip netns exec " + ns_[h] + " " + cmd; }

 private:
  std::string setup(int h) const {
    return "ip -n " + ns_[h] + " addr add " + address(h) + "/24 dev " + dev_[h] + " && ip -n " + ns_[h] + " link set " +
           dev_[h] + " up && ip -n " + ns_[h] + " link set lo up";
  }
  std::string ns_[2], dev_[2], why_;
};

#define REQUIRE_HOSTS(h)                                                                                    \
  if (!(h).why().empty()) GTEST_SKIP() << "cannot make network namespaces here (needs root and ip netns): " \
                                       << (h).why()

// `meshtrain launch` of 2 ranks on host `node` of 2, training `cfg` + `set`, restarting its
// ranks up to `restarts` times.
std::string launch_script(const test::Dir& d, const Hosts& hosts, int node, int port, const std::string& cfg,
                          const std::string& set, int restarts = 0) {
  const std::string bin = MESHTRAIN_BIN;
  return d.write("node" + std::to_string(node) + ".sh",
                 bin + " launch --nnodes 2 --node-rank " + std::to_string(node) + " --nproc-per-node 2 --master-addr " +
                     hosts.address(0) + " --master-port " + std::to_string(port) + " --grace 2 --max-restarts " +
                     std::to_string(restarts) + " " + bin + " train " + cfg + set + "\n");
}

// Lines in a file (0 when it does not exist).
int lines_of(const std::string& path) {
  std::ifstream f(path);
  return static_cast<int>(std::count(std::istreambuf_iterator<char>(f), {}, '\n'));
}

int free_port() { return 20000 + static_cast<int>(getpid() % 20000); }

// Kills what is left of the job on `port` when a test ends early (a failed assertion), so that
// the futures' destructors do not wait for 100000 steps. Declared after the futures: it runs first.
struct KillJobOnExit {
  int port;
  ~KillJobOnExit() { run_command("pkill -KILL -f -- '[-]-master-port " + std::to_string(port) + " '"); }
};

// The local addresses (hex, as /proc/net/tcp prints them) of sockets listening on `port` in host h.
std::vector<std::string> listening(const Hosts& hosts, int h, int port) {
  std::vector<std::string> out;
  std::istringstream table(run_command(hosts.in_ns(h, "cat /proc/net/tcp /proc/net/tcp6")).output);
  for (std::string line; std::getline(table, line);) {
    std::istringstream in(line);
    std::string sl, local, remote, state;
    in >> sl >> local >> remote >> state;
    const size_t colon = local.rfind(':');
    if (state != "0A" || colon == std::string::npos) continue;
    if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) out.push_back(local.substr(0, colon));
  }
  return out;
}

// 2 hosts x 2 ranks (dp 4) train what one process trains (losses and gradient norms at fp32
// rounding, 26 steps: past the first epoch's 23), and rank 0's rendezvous store listens on its
// host's address only.
TEST(MultiHost, TwoHostsTrainAsOneProcess) {
  Hosts hosts;
  REQUIRE_HOSTS(hosts);
  test::Dir d;
  const std::string cfg =
      test::tiny_config(d, "c.toml", "") + " --set model.dropout=0.0 --set train.steps=26";  // masks differ by data rank
  const std::string one = (d.path / "one").string(), two = (d.path / "two").string();
  ASSERT_EQ(run_command(std::string(MESHTRAIN_BIN) + " train " + cfg + " --nproc 1 --set train.metrics='\"" + one + "\"'").code, 0);
  const int port = free_port();
  const std::string set = " --set train.metrics='\"" + two + "\"'";
  auto a = std::async(std::launch::async, [&] { return run_command(hosts.on(0, launch_script(d, hosts, 0, port, cfg, set))); });
  auto b = std::async(std::launch::async, [&] { return run_command(hosts.on(1, launch_script(d, hosts, 1, port, cfg, set))); });
  const KillJobOnExit guard{port};
  std::vector<std::string> seen;
  for (int i = 0; i < 400 && seen.empty() && a.wait_for(std::chrono::milliseconds(25)) != std::future_status::ready; ++i) {
    seen = listening(hosts, 0, port);
  }
  const auto ra = a.get(), rb = b.get();
  ASSERT_EQ(ra.code, 0) << ra.output;
  ASSERT_EQ(rb.code, 0) << rb.output;
  EXPECT_NE(ra.output.find("[rank 1]"), std::string::npos) << ra.output;
  EXPECT_NE(rb.output.find("[rank 3]"), std::string::npos) << rb.output;
  EXPECT_EQ(ra.output.find("[rank 3]"), std::string::npos) << ra.output;
  test::expect_same_losses(one, two, 0, 26);
  ASSERT_FALSE(seen.empty()) << "rank 0's store was never seen listening on port " << port;
  for (const auto& addr : seen) EXPECT_EQ(addr, "01004D0A") << "the store listens on " << addr << ", not 10.77.0.1 alone";
}

// A job across hosts needs a job token (runtime/job_token.h): without one the launcher refuses
// before any rank starts; a node with another token is refused by rank 0, and the job ends on
// both hosts with one message each.
TEST(MultiHost, AJobTokenIsRequiredAndChecked) {
  Hosts hosts;
  REQUIRE_HOSTS(hosts);
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set train.steps=3";
  const int port = free_port();
  const KillJobOnExit guard{port};
  const auto none = run_command(hosts.on(0, launch_script(d, hosts, 0, port, cfg, ""), ""));
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.output.find("a job across hosts needs a job token"), std::string::npos) << none.output;
  EXPECT_EQ(none.output.find("[rank"), std::string::npos) << "ranks started: " << none.output;
  auto a = std::async(std::launch::async, [&] { return run_command(hosts.on(0, launch_script(d, hosts, 0, port, cfg, ""))); });
  auto b = std::async(std::launch::async, [&] {
    return run_command(hosts.on(1, launch_script(d, hosts, 1, port, cfg, ""), "another-token-0123456789"));
  });
  const auto ra = a.get(), rb = b.get();
  EXPECT_NE(ra.code, 0);
  EXPECT_NE(rb.code, 0);
  EXPECT_NE(ra.output.find("rank(s) 2, 3 presented no job token or a wrong one"), std::string::npos) << ra.output;
  EXPECT_NE(rb.output.find("rank 0 does not know this node's job token"), std::string::npos) << rb.output;
}

// A link cut mid-run ends the job on both hosts within comm.timeout and a few seconds (10.7 s
// after the cut at comm.timeout 10, measured), each launcher naming the other node's ranks as
// the ones that never arrived; nothing hangs.
TEST(MultiHost, ACutLinkEndsTheJobWithinTheTimeout) {
  Hosts hosts;
  REQUIRE_HOSTS(hosts);
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const std::string metrics = (d.path / "m").string();
  const int port = free_port() + 1;
  const std::string set =
      " --set train.steps=100000 --set comm.timeout=10 --set train.metrics='\"" + metrics + "\"'";
  auto a = std::async(std::launch::async, [&] { return run_command(hosts.on(0, launch_script(d, hosts, 0, port, cfg, set))); });
  auto b = std::async(std::launch::async, [&] { return run_command(hosts.on(1, launch_script(d, hosts, 1, port, cfg, set))); });
  const KillJobOnExit guard{port};
  for (int i = 0; i < 1200 && lines_of(metrics) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(lines_of(metrics), 3) << "the job never trained";
  const auto cut = std::chrono::steady_clock::now();
  ASSERT_EQ(run_command(hosts.link_down(0)).code, 0);
  const auto ra = a.get(), rb = b.get();
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - cut).count();
  EXPECT_LT(after, 10 + 30) << "the job outlived the cut by " << after << " s\n" << ra.output << rb.output;
  EXPECT_NE(ra.code, 0) << ra.output;
  EXPECT_NE(rb.code, 0) << rb.output;
  // Each launcher names the other node's ranks as the ones that never arrived.
  EXPECT_NE(ra.output.find("rank 2 (node 1; no flight record), rank 3 (node 1; no flight record) never arrived"),
            std::string::npos)
      << ra.output;
  EXPECT_NE(rb.output.find("rank 0 (node 0; no flight record), rank 1 (node 0; no flight record) never arrived"),
            std::string::npos)
      << rb.output;
}

// The link comes back after the cut: with --max-restarts each launcher restarts its ranks, they
// meet again and resume from the newest checkpoint, and every step's loss and gradient norm
// equal an uninterrupted run's bitwise (the steps redone after the checkpoint too).
TEST(MultiHost, AfterACutTheJobRestartsAndResumesBitwise) {
  Hosts hosts;
  REQUIRE_HOSTS(hosts);
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set train.steps=60 --set comm.timeout=8";
  const int port = free_port() + 2;
  auto job = [&](const std::string& tag, int restarts) {
    const std::string set = " --set checkpoint.every=10 --set checkpoint.dir='\"" + (d.path / (tag + "_ck")).string() +
                            "\"' --set train.metrics='\"" + (d.path / tag).string() + "\"'";
    return std::make_pair(
        std::async(std::launch::async,
                   [&, set, restarts] { return run_command(hosts.on(0, launch_script(d, hosts, 0, port, cfg, set, restarts))); }),
        std::async(std::launch::async,
                   [&, set, restarts] { return run_command(hosts.on(1, launch_script(d, hosts, 1, port, cfg, set, restarts))); }));
  };
  {
    auto [a, b] = job("whole", 0);
    ASSERT_EQ(a.get().code, 0);
    ASSERT_EQ(b.get().code, 0);
  }
  auto [a, b] = job("cut", 1);
  const KillJobOnExit guard{port};
  const std::string metrics = (d.path / "cut").string();
  for (int i = 0; i < 1200 && lines_of(metrics) < 12; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GE(lines_of(metrics), 12) << "the job never reached its first checkpoint";
  ASSERT_EQ(run_command(hosts.link_down(0)).code, 0);
  std::this_thread::sleep_for(std::chrono::seconds(9));  // past comm.timeout: both sides have failed
  ASSERT_EQ(run_command(hosts.link_up(0)).code, 0);
  const auto ra = a.get(), rb = b.get();
  ASSERT_EQ(ra.code, 0) << ra.output;
  ASSERT_EQ(rb.code, 0) << rb.output;
  EXPECT_NE(ra.output.find("restarting all local ranks (1 of 1 restarts)"), std::string::npos) << ra.output;
  const auto whole = test::losses((d.path / "whole").string()), cut = test::losses(metrics);  // the last line per step
  ASSERT_EQ(cut.size(), 60u) << metrics;
  for (const auto& [step, v] : whole) EXPECT_EQ(cut.at(step), v) << "step " << step;
}

// A node whose launcher is SIGKILLed (its ranks die with it: PR_SET_PDEATHSIG) is named by the
// other node's launcher like a lost link: its ranks never arrived, within the timeout.
TEST(MultiHost, AKilledLauncherIsNamedByTheOtherNode) {
  Hosts hosts;
  REQUIRE_HOSTS(hosts);
  test::Dir d;
  const std::string cfg = test::tiny_config(d, "c.toml", "");
  const std::string metrics = (d.path / "m").string();
  const int port = free_port() + 3;
  const std::string set = " --set train.steps=100000 --set comm.timeout=10 --set train.metrics='\"" + metrics + "\"'";
  auto a = std::async(std::launch::async, [&] { return run_command(hosts.on(0, launch_script(d, hosts, 0, port, cfg, set))); });
  auto b = std::async(std::launch::async, [&] { return run_command(hosts.on(1, launch_script(d, hosts, 1, port, cfg, set))); });
  const KillJobOnExit guard{port};
  for (int i = 0; i < 1200 && lines_of(metrics) < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(lines_of(metrics), 3) << "the job never trained";
  const auto killed = std::chrono::steady_clock::now();
  // [-]: the pattern does not match the shell that runs pkill.
  ASSERT_EQ(run_command("pkill -KILL -f -- '[-]-node-rank 1 --nproc-per-node 2 --master-addr 10.77.0.1 --master-port " +
                        std::to_string(port) + "'").code, 0);
  const auto ra = a.get(), rb = b.get();
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  EXPECT_LT(after, 10 + 30) << ra.output;
  EXPECT_EQ(rb.code, 128 + SIGKILL) << rb.output;
  EXPECT_NE(ra.code, 0) << ra.output;
  EXPECT_NE(ra.output.find("rank 2 (node 1; no flight record), rank 3 (node 1; no flight record) never arrived"),
            std::string::npos)
      << ra.output;
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// Slurm for real: a one-node cluster (scripts/slurm_local.sh: slurmctld, slurmd and munged on
// this machine, 4 CPUs offered). Ranks started by srun read the step's SLURM_* variables; a
// launcher started by srun starts its own; an sbatch script outside any step is one process
// that starts its ranks. Each trains what one process trains.
TEST(Slurm, SrunSbatchAndLaunchTrainAsOneProcess) {
  const std::string cluster = "bash " + std::string(MESHTRAIN_SOURCE_DIR) + "/scripts/slurm_local.sh";
  const auto up = run_command(cluster);
  struct Stop {  // the daemons end with the test
    std::string cmd;
    ~Stop() { run_command(cmd + " --stop"); }
  } stop{cluster};
  if (up.code == 2) GTEST_SKIP() << "no Slurm cluster here: " << up.output;
  ASSERT_EQ(up.code, 0) << up.output;
  test::Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set model.dropout=0.0";
  auto metrics = [&](const std::string& tag) { return " --set train.metrics='\"" + (d.path / tag).string() + "\"'"; };
  ASSERT_EQ(run_command(bin + " train " + cfg + " --nproc 1" + metrics("one")).code, 0);
  const std::string port = std::to_string(21000 + getpid() % 20000);
  // One task per rank: plain `srun -n4` (no --ntasks-per-node: SLURM_NTASKS_PER_NODE unset).
  auto r = run_command("MASTER_PORT=" + port + " timeout 300 srun -N1 -n4 " + bin + " train " + cfg + metrics("srun"));
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_same_losses((d.path / "one").string(), (d.path / "srun").string(), 0, 6);
  // One task that launches the ranks.
  r = run_command("timeout 300 srun -N1 -n1 " + bin + " launch --nproc-per-node 4 --master-port 0 " + bin + " train " +
                  cfg + metrics("launch"));
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_same_losses((d.path / "one").string(), (d.path / "launch").string(), 0, 6);
  // sbatch: the script itself (SLURM_PROCID=0 of SLURM_NTASKS=4, no step) is one process that starts 4 ranks.
  const std::string script =
      d.write("job.sh", "#!/bin/sh\n" + bin + " train " + cfg + " --nproc 4" + metrics("sbatch") + "\n");
  r = run_command("timeout 300 sbatch --wait -N1 -n4 -o " + (d.path / "job.out").string() + " " + script);
  ASSERT_EQ(r.code, 0) << r.output << run_command("cat " + (d.path / "job.out").string()).output;
  test::expect_same_losses((d.path / "one").string(), (d.path / "sbatch").string(), 0, 6);
}

}  // namespace
}  // namespace meshtrain

namespace meshtrain {
namespace {

// mpirun for real (Debian's OpenMPI, installed when missing): ranks started by `mpirun -np 4`
// read OMPI_COMM_WORLD_* and train what one process trains.
TEST(Mpi, MpirunRanksTrainAsOneProcess) {
  if (run_command("command -v mpirun || DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin").code != 0 ||
      run_command("command -v mpirun").code != 0) {
    GTEST_SKIP() << "no mpirun here (apt-get install openmpi-bin failed)";
  }
  test::Dir d;
  const std::string bin = MESHTRAIN_BIN;
  const std::string cfg = test::tiny_config(d, "c.toml", "") + " --set model.dropout=0.0";
  auto metrics = [&](const std::string& tag) { return " --set train.metrics='\"" + (d.path / tag).string() + "\"'"; };
  ASSERT_EQ(run_command(bin + " train " + cfg + " --nproc 1" + metrics("one")).code, 0);
  const auto r = run_command("MASTER_PORT=" + std::to_string(23000 + getpid() % 20000) +
                             " timeout 300 mpirun --allow-run-as-root --oversubscribe -x MASTER_PORT -np 4 " + bin +
                             " train " + cfg + metrics("mpi"));
  ASSERT_EQ(r.code, 0) << r.output;
  test::expect_same_losses((d.path / "one").string(), (d.path / "mpi").string(), 0, 6);
}

}  // namespace
}  // namespace meshtrain
