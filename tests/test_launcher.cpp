// `meshtrain launch` as a user runs it: real child processes, real signals.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/platform/threads.h"
#include "tests/run_command.h"
#include "tests/test_paths.h"

namespace {

using Result = meshtrain::test::CommandResult;
Result run(const std::string& cmd) { return meshtrain::test::run_command(cmd); }

const std::string kBin = MESHTRAIN_BIN;

TEST(Launcher, SetsTheRankVariables) {
  Result r = run(kBin + " launch --nproc-per-node 2 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 "
                        "--master-port 29999 sh -c 'echo R=$RANK L=$LOCAL_RANK W=$WORLD_SIZE LW=$LOCAL_WORLD_SIZE "
                        "A=$MASTER_ADDR P=$MASTER_PORT OMP=$OMP_WAIT_POLICY'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] R=2 L=0 W=4 LW=2 A=127.0.0.1 P=29999 OMP=PASSIVE"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[rank 3] R=3 L=1 W=4 LW=2"), std::string::npos) << r.output;
}

// A command that starts its own ranks (here `bench dp --nproc 2`) gives them
// cores / ranks threads each, not one process's count (all cores: what it set
// for itself when it re-executed with them, which it no longer does). A user's
// own OMP_NUM_THREADS is kept.
TEST(Launcher, SelfLaunchedRanksGetTheirShareOfCores) {
  const std::string clean = "env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u MESHTRAIN_AUTO_ENV -u MESHTRAIN_NO_REEXEC ";
  const std::string cmd = kBin + " bench dp --nproc 2 --model gpt-tiny --seq 16 --micro-batch 1 --steps 1 --rounds 1";
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  Result r = run(clean + cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(std::to_string(std::max(1L, cores / 2)) + " threads per rank"), std::string::npos) << r.output;
  r = run(clean + "OMP_NUM_THREADS=3 " + cmd);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("3 threads per rank"), std::string::npos) << r.output;
}

// One process alone on its node no longer re-executes itself for glibc's malloc tunables
// (threads.h): keep_freed_memory() sets their effect, so a large block comes from the heap,
// not mmap, and freeing it leaves the heap its size, ready for the next step's tensors.
TEST(Launcher, OneProcessKeepsFreedMemoryWithoutTunables) {
  meshtrain::keep_freed_memory();
  const size_t block = size_t{256} << 20;
  const struct mallinfo2 before = mallinfo2();
  void* p = std::malloc(block);
  ASSERT_NE(p, nullptr);
  static_cast<volatile char*>(p)[block - 1] = 1;
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the block was mmapped";
  ASSERT_GT(held.arena, before.arena) << "the heap did not grow: the block came from a free hole";
  std::free(p);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_EQ(after.arena, held.arena) << "the heap was trimmed when the block at its top was freed";
}

TEST(Launcher, PrefixesEveryLineIncludingStderrAndUnterminated) {
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port 0 sh -c 'echo one; echo two >&2; printf tail'");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* want : {"[rank 0] one\n", "[rank 1] two\n", "[rank 1] tail\n"}) {
    EXPECT_NE(r.output.find(want), std::string::npos) << want << " in\n" << r.output;
  }
}

TEST(Launcher, AFailingRankEndsTheJobAndIsNamed) {
  Result r = run(kBin + " launch --nproc-per-node 3 --master-port 0 --grace 2 sh -c "
                        "'if [ $RANK = 1 ]; then exit 3; fi; sleep 60'");
  EXPECT_EQ(r.code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed with exit code 3"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << "the other ranks were not stopped";
}

// The summary repeats the failing rank's own error line; the other ranks'
// errors after it (consequences: connection resets) are counted, not printed,
// so the cause is not lost among them.
TEST(Launcher, TheFailingRanksOwnErrorIsRepeated) {
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port 0 --grace 2 sh -c "
                        "'if [ $RANK = 1 ]; then sleep 0.3; echo \"meshtrain: error: model.vocab 7 is too small\" >&2; exit 1; "
                        "fi; trap \"\" TERM; sleep 1; echo \"meshtrain: error: connection reset\" >&2; exit 1'");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed with exit code 1 (its error: model.vocab 7 is too small)"), std::string::npos)
      << r.output;
  // Rank 0's later "connection reset" is a consequence: counted, not printed (unless asked for).
  EXPECT_EQ(r.output.find("[rank 0] meshtrain: error: connection reset"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 error line(s) the other ranks printed after it are left out"), std::string::npos)
      << r.output;
}

// Shared-memory segments a rank leaves (killed before it unlinked them) carry
// the launcher's job id, and the launcher removes them once its ranks are gone;
// another job's stay.
TEST(Launcher, RemovesTheSharedMemorySegmentsItsRanksLeft) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("meshtrain_shm_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/meshtrain-j1-5-0-0") << "another job's";
  Result r = run("MESHTRAIN_SHM_DIR=" + dir + " " + kBin + " launch --nproc-per-node 2 --master-port 0 sh -c "
                 "'echo x > $MESHTRAIN_SHM_DIR/meshtrain-j$MESHTRAIN_JOB-77-0-$RANK; kill -9 $$'");
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"meshtrain-j1-5-0-0"}) << r.output;
  std::filesystem::remove_all(dir);
}

TEST(Launcher, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port 0 --grace 1 sh -c "
                        "'trap \"\" TERM; if [ $RANK = 0 ]; then sleep 0.5; exit 4; fi; sleep 60'");
  EXPECT_EQ(r.code, 4) << r.output;
  EXPECT_LT(r.seconds, 30);
}

TEST(Launcher, ASignalledRankIsNamed) {
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port 0 sh -c "
                        "'if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.code, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("rank 0 failed with signal 9"), std::string::npos) << r.output;
}

// A memory cgroup of `bytes` below this process's own (cgroup v1 or v2), or ""
// when this machine does not let us make one (not root, no memory controller).
std::string make_memory_cgroup(const std::string& name, int64_t bytes) {
  namespace fs = std::filesystem;
  std::ifstream self("/proc/self/cgroup");
  std::string line, v1, v2;
  while (std::getline(self, line)) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers == "memory") v1 = "/sys/fs/cgroup/memory" + path;
    if (controllers.empty()) v2 = "/sys/fs/cgroup" + path;
  }
  for (const auto& [parent, limit] : {std::pair{v1, "memory.limit_in_bytes"}, std::pair{v2, "memory.max"}}) {
    if (parent.empty()) continue;
    const fs::path dir = fs::path(parent) / name;
    std::error_code ec;
    if (!fs::create_directory(dir, ec) || ec) continue;
    if (std::ofstream(dir / limit) << bytes << std::flush) {
      std::ofstream(dir / "memory.memsw.limit_in_bytes") << bytes;  // v1 with swap accounting: no swapping out of it
      std::ofstream(dir / "memory.swap.max") << 0;                  // v2
      return dir.string();
    }
    fs::remove(dir, ec);
  }
  return "";
}

// A rank the kernel's OOM killer stops (a real one: the rank's memory cgroup is
// 64 MiB and it allocates without end) is named as likely out of memory, not
// only as "signal 9".
TEST(Launcher, ARankKilledByTheOomKillerIsSaidToBeOutOfMemory) {
  const std::string cg = make_memory_cgroup("meshtrain_oom_" + std::to_string(getpid()), 64 << 20);
  if (cg.empty()) GTEST_SKIP() << "cannot make a memory cgroup here (needs root and a memory controller)";
  // `tail /dev/zero` keeps one ever-growing line in memory.
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port 0 --grace 2 sh -c "
                        "'if [ $RANK = 1 ]; then echo $$ > " + cg + "/cgroup.procs && exec tail /dev/zero; fi; sleep 60'");
  ::rmdir(cg.c_str());
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  EXPECT_NE(r.output.find("rank 1 failed with signal 9"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("out-of-memory killer stopped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("most likely ran out of memory"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  // A SIGKILL that is not the OOM killer's is not called one.
  r = run(kBin + " launch --nproc-per-node 1 --master-port 0 sh -c 'kill -9 $$'");
  EXPECT_EQ(r.output.find("out-of-memory"), std::string::npos) << r.output;
}

// A rank that stops making calls (its thread sleeps before its 3rd collective;
// the process still answers) makes the others time out: the launcher asks
// every live rank for its flight record and names the rank that never arrived,
// with its last call, not only the rank whose timeout fired. The records stay
// for `meshtrain diagnose hang DIR`. A rank killed at that point is named as
// the failure itself.
TEST(Launcher, TheRankThatNeverArrivedIsNamedFromTheFlightRecords) {
  const std::string bench = kBin + " bench comm --nproc 2 --timeout 3 --ops all_reduce --min 1K --max 1K --iters 4 "
                                   "--warmup 1";
  Result r = run("MESHTRAIN_CRASH_AT='comm.call@3 rank=1 signal=SLEEP' " + bench);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_LT(r.seconds, 30) << r.output;
  // (The sequence numbers depend on the bench's own calls before the timed ones.)
  for (const char* part : {"meshtrain launch: rank 1 (process sleeping; its last call on that group: sequence ",
                           "(completed)) never arrived at all_reduce (sum) at sequence ",
                           " of 256 Float elements on group 'world' (rank 0 failed there); rank 0 failed with exit "
                           "code 1 (its error: all_reduce on group 'world'"}) {
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  }
  const std::string marker = "flight records in ";
  const size_t at = r.output.find(marker);
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string dir = r.output.substr(at + marker.size(), r.output.find(';', at) - at - marker.size());
  Result d = run(kBin + " diagnose hang " + dir);
  EXPECT_EQ(d.code, 0) << d.output;
  EXPECT_NE(d.output.find("behind: rank 1 (its last call on that group: sequence "), std::string::npos) << d.output;
  EXPECT_NE(d.output.find("flight records of 2 of 2 ranks"), std::string::npos) << d.output;
  std::filesystem::remove_all(dir);

  r = run("MESHTRAIN_CRASH_AT='comm.call@3 rank=1' " + bench);
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.output;
  EXPECT_NE(r.output.find("meshtrain launch: rank 1 failed with signal 9"), std::string::npos) << r.output;
}

// The TCP sockets (of /proc/net/tcp and tcp6) that the processes whose
// environment holds `marker` own: {local "ADDRESS:PORT" in hex as the kernel
// writes it, state ("0A" = LISTEN)}.
// The processes whose environment holds `marker`.
std::vector<pid_t> pids_with_env(const std::string& marker) {
  std::vector<pid_t> out;
  for (const auto& p : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = p.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream env(p.path() / "environ");
    const std::string text((std::istreambuf_iterator<char>(env)), std::istreambuf_iterator<char>());
    if (text.find(marker) != std::string::npos) out.push_back(static_cast<pid_t>(std::stoi(pid)));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> tcp_sockets(const std::string& marker) {
  namespace fs = std::filesystem;
  std::set<std::string> inodes;
  for (const pid_t pid : pids_with_env(marker)) {
    std::error_code ec;
    for (const auto& fd : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "fd", ec)) {
      const std::string target = fs::read_symlink(fd.path(), ec).string();
      if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream f(table);
    std::string line;
    std::getline(f, line);  // header
    while (std::getline(f, line)) {
      std::istringstream in(line);
      std::string slot, local, remote, state, queues, timer, retr, uid, timeout, inode;
      in >> slot >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (inodes.count(inode)) out.emplace_back(local, state);
    }
  }
  return out;
}

// A job on one host listens on no wildcard address: its ranks meet through a
// store file (no TCP store, which listened on every interface for the whole
// job) and Gloo binds the loopback address. Checked in the socket table while
// the ranks of a real job wait (each rank's thread sleeps before its 3rd
// collective, after Gloo connected them).
TEST(Launcher, AJobOnOneHostListensOnNoWildcardAddress) {
  const std::string dir = (std::filesystem::temp_directory_path() / ("meshtrain_sockets_" + std::to_string(getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  const std::string cmd = "MESHTRAIN_FLIGHT_DIR=" + dir + " MESHTRAIN_CRASH_AT='comm.call@3 signal=SLEEP' " + kBin +
                          " bench comm --nproc 2 --ops all_reduce --min 1K --max 1K --iters 4 --warmup 1 "
                          "--transport native > " + dir + "/log 2>&1";
  auto job = std::async(std::launch::async, [&] { return run(cmd); });
  // Wait until both ranks have reached their crash point (then their sockets are what they keep).
  for (int i = 0; i < 600; ++i) {
    std::ifstream log(dir + "/log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    size_t n = 0;
    for (size_t at = 0; (at = text.find("sleeps for ever", at)) != std::string::npos; ++at) ++n;
    if (n == 2) break;
    usleep(50000);
  }
  // Every TCP socket of the job (Gloo's connections; a TCP store would listen for the whole job) is on loopback.
  const auto sockets = tcp_sockets("MESHTRAIN_FLIGHT_DIR=" + dir);
  EXPECT_FALSE(sockets.empty()) << "the ranks hold no TCP socket: the check saw nothing";
  for (const auto& [local, state] : sockets) {
    const std::string addr = local.substr(0, local.find(':'));
    EXPECT_NE(addr.find_first_not_of('0'), std::string::npos) << "bound to a wildcard address: " << local << " state "
                                                              << state;
    EXPECT_NE(addr.find("0100007F"), std::string::npos) << "not loopback: " << local;
  }
  // Stop the job: its ranks sleep for ever.
  for (const pid_t pid : pids_with_env("MESHTRAIN_FLIGHT_DIR=" + dir)) ::kill(pid, SIGKILL);
  job.get();
  std::filesystem::remove_all(dir);
}

// A benchmark prints the transport variables it ran with (sorted), so its
// numbers can be read with them.
TEST(Launcher, BenchCommPrintsTheTransportVariablesInEffect) {
  Result r = run("env -u NCCL_DEBUG -u GLOO_SOCKET_IFNAME NCCL_DEBUG=WARN GLOO_SOCKET_IFNAME=lo " + kBin +
                 " bench comm --nproc 2 --ops all_reduce --min 1K --max 1K --iters 2 --warmup 1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("transport variables: GLOO_SOCKET_IFNAME=lo NCCL_DEBUG=WARN"), std::string::npos) << r.output;
}

// --axis each measures every group of every axis of the mesh: on tp=2 x dp=2
// the tp groups {0,1}, {2,3} and the dp groups {0,2}, {1,3}, all inside the
// one node of this job, each with a latency, a half-peak size and a peak busbw.
TEST(Launcher, BenchCommMeasuresEveryGroupOfEveryAxis) {
  Result r = run(kBin + " bench comm --nproc 4 --mesh tp=2 --axis each --min 1K --max 64K --iters 2 --warmup 1");
  EXPECT_EQ(r.code, 0) << r.output;
  for (const char* group : {"tp    all_reduce      0,1              inside node",
                            "tp    all_reduce      2,3              inside node",
                            "dp    all_reduce      0,2              inside node",
                            "dp    all_reduce      1,3              inside node",
                            "all_reduce inside a node: 4 group(s)", "all_reduce across nodes: no group of this job"}) {
    EXPECT_NE(r.output.find(group), std::string::npos) << group << "\n" << r.output;
  }
}

// Malformed diagnosis variables are one clear error naming the value and the syntax.
TEST(Launcher, MalformedDiagnosisVariablesAreClearErrors) {
  const std::string bench = " " + kBin + " bench comm --nproc 2 --ops all_reduce --min 1K --max 1K --iters 2";
  Result r = run("MESHTRAIN_FLIGHT_RECORDER=lots" + bench);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("MESHTRAIN_FLIGHT_RECORDER='lots' is not a count of calls"), std::string::npos) << r.output;
  r = run("MESHTRAIN_CRASH_AT='comm.call@x'" + bench);
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("MESHTRAIN_CRASH_AT='comm.call@x': '@x' is not a count >= 1"), std::string::npos)
      << r.output;
  r = run("MESHTRAIN_CRASH_AT='comm.call signal=TERM'" + bench);
  EXPECT_NE(r.output.find("unknown word 'signal=TERM'; use \"POINT[@K] [rank=R] [signal=KILL|STOP|SLEEP]\""),
            std::string::npos)
      << r.output;
}

TEST(Launcher, RestartsTheGroup) {
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port 0 --max-restarts 2 sh -c "
                        "'echo attempt $MESHTRAIN_RESTART_COUNT; [ $MESHTRAIN_RESTART_COUNT -ge 1 ]'");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restarting all local ranks (1 of 2 restarts)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] attempt 1"), std::string::npos) << r.output;
}

TEST(Launcher, CtrlCReachesEveryChild) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("meshtrain_sigint_" + std::to_string(getpid()));
  fs::create_directories(dir);
  pid_t pid = fork();
  if (pid == 0) {
    std::string script = "echo $$ > " + dir.string() + "/pid.$RANK; exec sleep 60";
    execl(kBin.c_str(), kBin.c_str(), "launch", "--nproc-per-node", "3", "--master-port", "0", "sh", "-c",
          script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Wait until every child wrote its pid.
  for (int i = 0; i < 200 && !(fs::exists(dir / "pid.2") && fs::exists(dir / "pid.0") && fs::exists(dir / "pid.1"));
       ++i)
    usleep(50000);
  usleep(100000);
  kill(pid, SIGINT);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 128 + SIGINT);
  for (int r = 0; r < 3; ++r) {
    std::ifstream f(dir / ("pid." + std::to_string(r)));
    pid_t child = 0;
    f >> child;
    ASSERT_GT(child, 0);
    EXPECT_NE(kill(child, 0), 0) << "rank " << r << " (pid " << child << ") survived Ctrl-C";
  }
  fs::remove_all(dir);
}

TEST(Launcher, PortInUseIsAClearError) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = 0;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof sa;
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  const int port = ntohs(sa.sin_port);
  Result r = run(kBin + " launch --nproc-per-node 2 --master-port " + std::to_string(port) + " true");
  close(fd);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--master-port " + std::to_string(port) + " is in use"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--master-port 0"), std::string::npos) << r.output;
}

TEST(Launcher, BadOptionsAreClearErrors) {
  Result r = run(kBin + " launch --nproc-per-node 0 true");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--nproc-per-node 0 must be at least 1"), std::string::npos) << r.output;
  r = run(kBin + " launch --nnodes 2 --node-rank 2 true");
  EXPECT_NE(r.output.find("--node-rank 2 must be in 0..1"), std::string::npos) << r.output;
  r = run(kBin + " launch --nnodes 2 --master-port 0 true");
  EXPECT_NE(r.output.find("works on one node only"), std::string::npos) << r.output;
  r = run(kBin + " launch --nproc-per-node 1 --master-port 0 /no/such/program");
  EXPECT_EQ(r.code, 127) << r.output;
  EXPECT_NE(r.output.find("cannot run '/no/such/program'"), std::string::npos) << r.output;
}

// `--` ends the launcher's options (torchrun's spelling); one after the program is the program's.
TEST(Launcher, DoubleDashEndsTheLaunchersOptions) {
  Result r = run(kBin + " launch --nproc-per-node 1 --master-port 0 -- echo a -- b");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] a -- b"), std::string::npos) << r.output;
  r = run(kBin + " launch --nproc-per-node=1 --master-port=0 -- echo c");
  EXPECT_NE(r.output.find("[rank 0] c"), std::string::npos) << r.output;
}

TEST(Launcher, AMistypedCommandNamesTheNearestOne) {
  Result r = run(kBin + " trian configs/kjv-tiny.toml");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown command 'trian', did you mean 'train'?"), std::string::npos) << r.output;
  r = run(kBin + " frobnicate");
  EXPECT_NE(r.output.find("unknown command 'frobnicate'; the commands are: launch,"), std::string::npos) << r.output;
  // One level down too (CLI11 alone says "A subcommand is required" without naming the word).
  r = run(kBin + " ckpt verfy /nowhere");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("unknown command 'verfy', did you mean 'verify'?; the commands of 'meshtrain ckpt' are:"),
            std::string::npos)
      << r.output;
}

TEST(Launcher, MissingRankVariablesAreNamed) {
  Result r = run("env -u WORLD_SIZE RANK=0 " + kBin + " lab 01");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("WORLD_SIZE is missing"), std::string::npos) << r.output;
}

TEST(Launcher, MeshErrorsFromTheCli) {
  Result r = run(kBin + " mesh --world 6 --mesh tp=4");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("world size 6 is not divisible"), std::string::npos) << r.output;
  r = run(kBin + " mesh --world 4 --mesh zp=2");
  EXPECT_NE(r.output.find("unknown mesh axis 'zp'"), std::string::npos) << r.output;
  r = run(kBin + " bench block --iters 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("--iters 0 must be positive"), std::string::npos) << r.output;
  r = run(kBin + " plan --model llama2-7b --gpus 8 --top 0");
  EXPECT_NE(r.output.find("--top 0 must be at least 1"), std::string::npos) << r.output;
}

}  // namespace
