// Peer credentials: root and the daemon's user administer; any other local user may infer and read
// status, and gets PERMISSION_DENIED for the rest. Needs root to act as a second user (nobody).
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

constexpr uid_t kNobody = 65534;

class AccessTest : public DaemonTest {
 protected:
  // Runs the warmpool CLI as nobody; returns its exit status and what it wrote to stderr.
  // open_socket: make the socket connectable by anyone first (as if nobody were in its group).
  int CliAsNobody(const std::vector<std::string>& args, std::string* err, bool open_socket = true) {
    std::string cli = dir_ + "/warmpool-cli";
    std::filesystem::copy_file(BinDir() + "/warmpool", cli,
                               std::filesystem::copy_options::overwrite_existing);
    chmod(cli.c_str(), 0755);
    chmod(dir_.c_str(), 0711);
    if (open_socket) chmod(socket_.c_str(), 0666);
    std::string err_path = dir_ + "/nobody.err";
    pid_t pid = fork();
    if (pid == 0) {
      int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
      dup2(fd, 2);
      int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      if (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 || setuid(kNobody) != 0) _exit(99);
      std::vector<std::string> argv = {cli, "--socket", socket_};
      argv.insert(argv.end(), args.begin(), args.end());
      std::vector<char*> c;
      for (std::string& a : argv) c.push_back(a.data());
      c.push_back(nullptr);
      execv(c[0], c.data());
      _exit(98);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    std::ifstream in(err_path);
    err->assign(std::istreambuf_iterator<char>(in), {});
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

TEST_F(AccessTest, OtherUsersMayInferButNotAdminister) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as a second user";
  MakeModel("m", "8,4");
  StartDaemon();
  std::string err;
  EXPECT_EQ(CliAsNobody({"load", "m"}, &err), 1);
  EXPECT_NE(err.find("error: PERMISSION_DENIED: uid 65534 may infer and read status"),
            std::string::npos) << err;
  EXPECT_EQ(CliAsNobody({"pin", "m"}, &err), 1);
  EXPECT_NE(err.find("PERMISSION_DENIED"), std::string::npos) << err;
  EXPECT_EQ(CliAsNobody({"infer", "m", "--random", "1"}, &err), 0) << err;
  EXPECT_EQ(CliAsNobody({"status"}, &err), 0) << err;
  EXPECT_EQ(CliAsNobody({"unload", "m"}, &err), 1);
  std::string out;
  EXPECT_EQ(Cli({"unload", "m"}, &out, &err), 0) << err;  // root administers
}

TEST_F(AccessTest, TheSocketGroupMayConnectAndNobodyElse) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as a second user";
  MakeModel("m", "8,4");
  StartDaemon();
  struct stat st{};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string err;
  EXPECT_EQ(CliAsNobody({"status"}, &err, /*open_socket=*/false), 1);
  EXPECT_NE(err.find("Permission denied"), std::string::npos) << err;
  ExpectQuiescentAndValid();
  ASSERT_EQ(StopDaemon(), 0);

  // nobody's primary group is nogroup: with the socket given to it, nobody gets in (to infer).
  StartDaemon("[access]\nsocket_group = \"nogroup\"\nobserver_group = \"nogroup\"\n");
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, kNobody);
  EXPECT_EQ(CliAsNobody({"infer", "m", "--random", "1"}, &err, /*open_socket=*/false), 0) << err;
  EXPECT_EQ(CliAsNobody({"load", "m"}, &err, /*open_socket=*/false), 1);
  EXPECT_NE(err.find("PERMISSION_DENIED"), std::string::npos) << err;
  // The observer group may read the segment, not write it.
  ASSERT_EQ(stat(("/dev/shm/warmpool." + instance_).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_gid, kNobody);
}

TEST_F(AccessTest, MembersOfTheAdminGroupAdminister) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as a second user";
  MakeModel("m", "8,4");
  StartDaemon("[access]\nadmin_group = \"nogroup\"\nsocket_group = \"nogroup\"\n");
  std::string err;
  EXPECT_EQ(CliAsNobody({"load", "m"}, &err, /*open_socket=*/false), 0) << err;
  EXPECT_EQ(CliAsNobody({"pin", "m"}, &err, /*open_socket=*/false), 0) << err;
  EXPECT_EQ(CliAsNobody({"unpin", "m"}, &err, /*open_socket=*/false), 0) << err;
  EXPECT_EQ(CliAsNobody({"unload", "m"}, &err, /*open_socket=*/false), 0) << err;
}

TEST_F(AccessTest, UnknownAdminGroupIsRefusedAtStart) {
  std::ofstream(dir_ + "/bad.toml") << "[access]\nadmin_group = \"no-such-group-xyz\"\n";
  std::string out, err;
  int rc = RunProgram({BinDir() + "/warmpoold", "--config", dir_ + "/bad.toml", "--socket", socket_,
                       "--instance", instance_},
                      &out, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("admin_group \"no-such-group-xyz\" is not a group on this machine"),
            std::string::npos) << err;
}

}  // namespace
}  // namespace warmpool::testing
