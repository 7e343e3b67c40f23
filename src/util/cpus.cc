#include "util/cpus.h"

#include <unistd.h>

#include <algorithm>

namespace loom::cpus {

cpu_set_t allowed() {
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    CPU_ZERO(&mask);
    const long online = std::clamp<long>(sysconf(_SC_NPROCESSORS_ONLN), 1, CPU_SETSIZE);
    for (int c = 0; c < static_cast<int>(online); ++c) CPU_SET(c, &mask);
  }
  return mask;
}

std::string formatMask(const cpu_set_t& mask) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  for (int base = CPU_SETSIZE - 4; base >= 0; base -= 4) {
    int digit = 0;
    for (int b = 0; b < 4; ++b)
      if (CPU_ISSET(base + b, &mask)) digit |= 1 << b;
    if (digit != 0 || !out.empty()) out.push_back(kDigits[digit]);
  }
  return out.empty() ? "0" : out;
}

bool parseMask(const std::string& text, cpu_set_t* mask) {
  CPU_ZERO(mask);
  if (text.empty()) return false;
  const size_t digits = text.size();
  for (size_t i = 0; i < digits; ++i) {
    const char ch = text[i];
    int digit;
    if (ch >= '0' && ch <= '9')
      digit = ch - '0';
    else if (ch >= 'a' && ch <= 'f')
      digit = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F')
      digit = ch - 'A' + 10;
    else
      return false;
    const size_t base = (digits - 1 - i) * 4;  // the CPU of this digit's lowest bit
    for (int b = 0; b < 4; ++b) {
      if ((digit & (1 << b)) == 0) continue;
      if (base + static_cast<size_t>(b) >= CPU_SETSIZE) return false;
      CPU_SET(static_cast<int>(base) + b, mask);
    }
  }
  return true;
}

int ranksPerCore(const std::vector<cpu_set_t>& masks) {
  cpu_set_t all;
  CPU_ZERO(&all);
  for (const cpu_set_t& m : masks) CPU_OR(&all, &all, &m);
  const long cores = std::max(CPU_COUNT(&all), 1);
  const long ranks = static_cast<long>(masks.size());
  return static_cast<int>(std::max<long>(1, (ranks + cores - 1) / cores));
}

}  // namespace loom::cpus
