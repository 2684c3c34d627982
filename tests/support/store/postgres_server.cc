#include "tests/support/store/postgres_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tally::store::testing {
namespace {

constexpr char kDefaultBinDir[] = "/usr/lib/postgresql/15/bin";

std::string BinDir() {
  const char* env = std::getenv("TALLY_POSTGRES_BIN_DIR");
  return env != nullptr && *env != '\0' ? env : kDefaultBinDir;
}

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(err)));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The uid/gid to run PostgreSQL as: `nobody` when we are root, else ourselves.
struct RunAs {
  bool drop = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

absl::StatusOr<RunAs> PickUser() {
  RunAs r;
  if (geteuid() != 0) return r;
  const passwd* pw = getpwnam("nobody");
  if (pw == nullptr) {
    return absl::FailedPreconditionError(
        "running as root, and PostgreSQL refuses to run as root, but there is no user "
        "`nobody` to run it as; run the tests as an unprivileged user");
  }
  r.drop = true;
  r.uid = pw->pw_uid;
  r.gid = pw->pw_gid;
  return r;
}

}  // namespace

absl::Status PostgresServer::StartWatchdog() {
  ASSIGN_OR_RETURN(RunAs run_as, PickUser());
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Runs when the test process is gone: stop the server, remove the dir.
  std::vector<std::string> argv_s = {
      "/bin/sh",
      "-c",
      "[ -d \"$2/data\" ] || exit 0; \"$1/pg_ctl\" stop -D \"$2/data\" -m immediate -w -t 30; "
      "rm -rf \"$2\"",
      "tally-pg-watchdog",
      bin_dir_,
      dir_};
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  const long max_fd = sysconf(_SC_OPEN_MAX);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec. Its own session, so a
    // Ctrl-C to the test does not kill it before it cleans up.
    setsid();
    if (null_fd >= 0) {
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(null_fd, 2);
    }
    for (long fd = 3; fd < max_fd && fd < 65536; ++fd) {
      if (fd != fds[0]) close(static_cast<int>(fd));
    }
    char c;
    while (true) {
      const ssize_t n = read(fds[0], &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    if (run_as.drop &&
        (setgroups(0, nullptr) != 0 || setgid(run_as.gid) != 0 || setuid(run_as.uid) != 0)) {
      _exit(126);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[0]);
  if (null_fd >= 0) close(null_fd);
  watchdog_pid_ = pid;
  watchdog_fd_ = fds[1];
  return absl::OkStatus();
}

absl::Status PostgresServer::RunTool(const std::string& tool,
                                     const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(RunAs run_as, PickUser());
  const std::string path = absl::StrCat(bin_dir_, "/", tool);
  const std::string out_path = absl::StrCat(dir_, "/", tool, ".out");
  std::vector<std::string> argv_s = {path};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", out_path, ": ", std::strerror(errno)));
  }
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const long max_fd = sysconf(_SC_OPEN_MAX);
  const pid_t pid = fork();
  if (pid < 0) {
    close(out_fd);
    if (null_fd >= 0) close(null_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    if (null_fd >= 0) dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    // The server must not hold the test's pipes open after we exit.
    for (long fd = 3; fd < max_fd && fd < 65536; ++fd) close(static_cast<int>(fd));
    if (run_as.drop) {
      if (setgroups(0, nullptr) != 0 || setgid(run_as.gid) != 0 || setuid(run_as.uid) != 0) {
        _exit(126);
      }
    }
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(out_fd);
  if (null_fd >= 0) close(null_fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  std::string why = WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                                      : absl::StrCat("signal ", WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 126) why += " (could not switch to user nobody)";
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) why += " (could not execute it)";
  std::string msg = absl::StrCat(path, " failed: ", why, "\n", ReadFile(out_path));
  if (tool == "pg_ctl") {
    absl::StrAppend(&msg, "\nserver log:\n", ReadFile(absl::StrCat(dir_, "/server.log")));
  }
  return absl::InternalError(msg);
}

absl::StatusOr<std::unique_ptr<PostgresServer>> PostgresServer::Start() {
  const std::string bin_dir = BinDir();
  for (const char* tool : {"initdb", "pg_ctl", "postgres"}) {
    const std::string path = absl::StrCat(bin_dir, "/", tool);
    if (access(path.c_str(), X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "PostgreSQL server binary ", path,
          " not found; run scripts/setup.sh (installs Debian's postgresql and libpq-dev), "
          "or set TALLY_POSTGRES_BIN_DIR to the directory holding initdb and pg_ctl"));
    }
  }
  ASSIGN_OR_RETURN(RunAs run_as, PickUser());
  ASSIGN_OR_RETURN(int port, FreeLoopbackPort());
  // /tmp, not $TMPDIR: `nobody` must be able to reach it, and the socket path
  // must stay short (107 bytes).
  char tmpl[] = "/tmp/tally-pg-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  const std::string dir = tmpl;
  if (run_as.drop && chown(dir.c_str(), run_as.uid, run_as.gid) != 0) {
    const int err = errno;
    std::filesystem::remove_all(dir);
    return absl::InternalError(absl::StrCat("chown ", dir, " to nobody: ", std::strerror(err)));
  }
  // From here the server object owns (and on failure removes) the dir.
  std::unique_ptr<PostgresServer> server(new PostgresServer(bin_dir, dir, port));
  RETURN_IF_ERROR(server->StartWatchdog());
  // -N: initdb's own fsyncs only slow the test; the server keeps fsync on.
  RETURN_IF_ERROR(server->RunTool("initdb", {"-D", dir + "/data", "-U", "tally", "-A", "trust",
                                             "-N", "-E", "UTF8", "--locale=C"}));
  // The port is free when picked but may be taken before postgres binds it:
  // try a few. The last `port` line in postgresql.conf wins.
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) {
      ASSIGN_OR_RETURN(server->port_, FreeLoopbackPort());
    }
    std::ofstream conf(dir + "/data/postgresql.conf", std::ios::app);
    conf << "\nlisten_addresses = '127.0.0.1'\n"
         << "port = " << server->port_ << "\n"
         << "unix_socket_directories = '" << dir << "'\n"
         << "fsync = on\n"
         << "synchronous_commit = on\n"
         << "max_connections = 100\n"
         << "shared_buffers = 32MB\n";
    conf.close();
    if (!conf) {
      return absl::InternalError(absl::StrCat("cannot write ", dir, "/data/postgresql.conf"));
    }
    last = server->Start_();
    if (last.ok()) return server;
  }
  return last;
}

PostgresServer::~PostgresServer() {
  if (watchdog_pid_ > 0) {
    kill(watchdog_pid_, SIGKILL);
    waitpid(watchdog_pid_, nullptr, 0);
    close(watchdog_fd_);
  }
  if (running_) {
    RunTool("pg_ctl", {"stop", "-D", dir_ + "/data", "-m", "immediate", "-w", "-t", "30"})
        .IgnoreError();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string PostgresServer::Dsn(const std::string& dbname) const {
  return absl::StrCat("host=127.0.0.1 port=", port_, " user=tally dbname=", dbname,
                      " sslmode=disable connect_timeout=5");
}

absl::StatusOr<std::string> PostgresServer::CreateDatabase() {
  const std::string name = absl::StrCat("tally_test_", next_db_.fetch_add(1));
  PGconn* conn = PQconnectdb(Dsn().c_str());
  if (PQstatus(conn) != CONNECTION_OK) {
    std::string msg = absl::StrCat("connect to ", Dsn(), ": ", PQerrorMessage(conn));
    PQfinish(conn);
    return absl::UnavailableError(msg);
  }
  // The name is ours (a counter), not user data.
  PGresult* res = PQexec(conn, absl::StrCat("CREATE DATABASE ", name).c_str());
  absl::Status s;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    s = absl::InternalError(absl::StrCat("CREATE DATABASE ", name, ": ", PQerrorMessage(conn)));
  }
  PQclear(res);
  PQfinish(conn);
  RETURN_IF_ERROR(s);
  return Dsn(name);
}

absl::Status PostgresServer::Stop() {
  if (!running_) return absl::OkStatus();
  RETURN_IF_ERROR(
      RunTool("pg_ctl", {"stop", "-D", dir_ + "/data", "-m", "fast", "-w", "-t", "30"}));
  running_ = false;
  return absl::OkStatus();
}

absl::Status PostgresServer::Start_() {
  if (running_) return absl::OkStatus();
  RETURN_IF_ERROR(RunTool(
      "pg_ctl", {"start", "-D", dir_ + "/data", "-l", dir_ + "/server.log", "-w", "-t", "30"}));
  running_ = true;
  return absl::OkStatus();
}

absl::Status PostgresServer::Restart() {
  RETURN_IF_ERROR(Stop());
  return Start_();
}

}  // namespace tally::store::testing
