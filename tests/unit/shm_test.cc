// Named segments that outlive a killed creator: a later sweep (shm::removeAbandoned) removes
// them, and removes nothing a live process holds, nothing unsized (a segment being created),
// nothing of another user's. Creators and victims are real forked processes.
#include "util/shm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace loom {
namespace {

std::string testName(const char* what) {
  return "/loom-shmtest-" + std::to_string(getpid()) + "-" + what;
}

bool exists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// Runs `body` in a child that then dies by SIGKILL (no exit handlers, no destructors).
template <typename F>
void inKilledChild(F body) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    body();
    raise(SIGKILL);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

// Whether a sweep in another process removes `name` (the sweep runs in a forked child, as a
// later process on the host would).
bool sweptByAnotherProcess(const std::string& name) {
  const pid_t pid = fork();
  if (pid == 0) {
    shm::removeAbandoned();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return !exists(name);
}

TEST(Shm, KilledCreatorsSegmentIsRemovedBySweep) {
  const std::string name = testName("killed");
  inKilledChild([&] {
    Result<int> fd = shm::createHeld(name, 8192, "test");
    if (!fd.isOk()) _exit(3);
  });
  // Tests running at once set up communicators, which sweep too: one of them may have removed
  // the segment already, which is what this test looks for.
  if (!exists(name)) GTEST_SKIP() << name << " was removed by another process's sweep first";
  EXPECT_TRUE(sweptByAnotherProcess(name));
  shm_unlink(name.c_str());
}

TEST(Shm, LiveCreatorsSegmentStays) {
  const std::string name = testName("live");
  Result<int> fd = shm::createHeld(name, 8192, "test");
  ASSERT_TRUE(fd.isOk()) << fd.status().message();
  EXPECT_FALSE(sweptByAnotherProcess(name)) << "a segment held by a live process was removed";
  // Its name cannot be taken over either: the error says a live process holds it.
  const pid_t pid = fork();
  if (pid == 0) _exit(shm::createHeld(name, 8192, "test").isOk() ? 1 : 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  Result<int> again = shm::createHeld(name, 8192, "test");
  ASSERT_FALSE(again.isOk());
  EXPECT_NE(again.status().message().find("live process"), std::string::npos)
      << again.status().message();
  shm_unlink(name.c_str());
  close(fd.value());
}

TEST(Shm, UnsizedSegmentStaysForItsCreator) {
  // A creator sizes its segment only once it holds the lock: a sweep that finds a segment at
  // size 0 may be looking at one being created.
  const std::string name = testName("unsized");
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_FALSE(sweptByAnotherProcess(name));
  // Its own name's creator replaces it.
  Result<int> mine = shm::createHeld(name, 4096, "test");
  ASSERT_TRUE(mine.isOk()) << mine.status().message();
  struct stat st {};
  ASSERT_EQ(fstat(mine.value(), &st), 0);
  EXPECT_EQ(st.st_size, 4096);
  shm_unlink(name.c_str());
  close(mine.value());
}

TEST(Shm, AbandonedSegmentOfTheSameNameIsReplaced) {
  const std::string name = testName("reused");
  inKilledChild([&] {
    Result<int> fd = shm::createHeld(name, 8192, "test");
    if (!fd.isOk()) _exit(3);
  });
  if (!exists(name)) GTEST_SKIP() << name << " was removed by another process's sweep first";
  Result<int> fd = shm::createHeld(name, 4096, "test");
  ASSERT_TRUE(fd.isOk()) << fd.status().message();
  struct stat after {};
  ASSERT_EQ(fstat(fd.value(), &after), 0);
  EXPECT_EQ(after.st_size, 4096);
  shm_unlink(name.c_str());
  close(fd.value());
}

TEST(Shm, OtherUsersSegmentIsNotSwept) {
  if (geteuid() != 0) GTEST_SKIP() << "a segment owned by another user needs root to make";
  const std::string name = testName("other");
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(fchown(fd, 65534, 65534), 0);
  close(fd);
  EXPECT_FALSE(sweptByAnotherProcess(name));
  shm_unlink(name.c_str());
}

}  // namespace
}  // namespace loom
