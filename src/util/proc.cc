#include "util/proc.h"

#include <fstream>
#include <string>

namespace loom::proc {

bool alive(int pid) {
  if (pid <= 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 'X';
  return state != 'Z' && state != 'X';
}

}  // namespace loom::proc
