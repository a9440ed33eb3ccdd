// Runs test code in a child process whose /dev/shm is a small private tmpfs, so that filling it touches nothing
// else on the machine:
//
//   const ChildReport report = InSmallShm(8 << 20, [] { return ShmSegment::Create(16 << 20).ok() ? "oops" : ""; });
//   if (report.skipped) GTEST_SKIP() << report.text;
//   EXPECT_EQ(report.text, "");
#pragma once

#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>

namespace hp::shmem::testutil {

// What a child process reported: `skipped` (its reason in `text`), or `text` = what went wrong ("" = nothing).
struct ChildReport {
  bool skipped = false;
  std::string text;
};

// Runs `body` in a child process whose /dev/shm is a private tmpfs of `tmpfs_size` bytes, in a mount namespace of
// its own. `body` returns "" when all went well, else what went wrong; threads it starts share that /dev/shm. A
// child killed by a signal (SIGBUS on a page tmpfs could not allocate) is reported as such; it gets 60 s. Call it
// while this process runs no other thread (fork copies only the calling one).
inline ChildReport InSmallShm(std::size_t tmpfs_size, const std::function<std::string()>& body) {
  int fds[2];
  if (pipe(fds) != 0) return {false, std::string("pipe failed: ") + std::strerror(errno)};
  const pid_t child = fork();
  if (child < 0) return {false, std::string("fork failed: ") + std::strerror(errno)};
  if (child == 0) {
    close(fds[0]);
    std::string report;
    if (unshare(CLONE_NEWNS) != 0) {
      report = std::string("S") + "a private /dev/shm needs a mount namespace (CAP_SYS_ADMIN): unshare: " +
               std::strerror(errno);
    } else if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
               mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
                     ("mode=1777,size=" + std::to_string(tmpfs_size)).c_str()) != 0) {
      report = std::string("Fmounting a private tmpfs on /dev/shm failed: ") + std::strerror(errno);
    } else {
      report = "R" + body();
    }
    const ssize_t ignored = write(fds[1], report.data(), report.size());
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fds[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
      timed_out = true;
      break;
    }
    char buffer[4096];
    const ssize_t n = read(fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    report.append(buffer, static_cast<std::size_t>(n));
  }
  close(fds[0]);
  if (timed_out) kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);   // the child has closed its end (exited) or was killed: this returns at once
  if (timed_out) return {false, "the child did not finish within 60 s"};
  if (WIFSIGNALED(status)) return {false, "the child was killed by signal " + std::to_string(WTERMSIG(status))};
  if (report.empty()) return {false, "the child reported nothing"};
  if (report[0] == 'S') return {true, report.substr(1)};
  return {false, report.substr(1)};
}

}  // namespace hp::shmem::testutil
