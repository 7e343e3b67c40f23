// Internals of loomCommInitFromEnv (init_env.cc) that tests check directly: the Slurm node-list
// parser and the default Slurm port. Header-only, so a test needs no internal library.
#pragma once

#include <string>

namespace loom::api {

// Under Slurm without LOOM_COMM_ID or LOOM_COMM_PORT, the root listens on the first node at
// kSlurmBasePort + (SLURM_JOB_ID + SLURM_STEP_ID) % kSlurmPortSpan: below torchrun's 29500 and
// below Linux's ephemeral ports, and different for concurrent jobs and steps on one node.
constexpr int kSlurmBasePort = 28500;
constexpr int kSlurmPortSpan = 1000;

namespace detail {

inline bool allDigits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// Checks one bracket's contents ("01-04,07") and returns its first number ("01").
inline bool firstOfRange(const std::string& range, std::string* first, std::string* why) {
  size_t start = 0;
  first->clear();
  while (true) {
    const size_t comma = range.find(',', start);
    const size_t len = comma == std::string::npos ? std::string::npos : comma - start;
    const std::string item = range.substr(start, len);
    const size_t dash = item.find('-');
    const std::string lo = item.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : item.substr(dash + 1);
    if (!allDigits(lo) || !allDigits(hi)) {
      *why = "\"" + item + "\" in [" + range + "] is not a number or a range of numbers";
      return false;
    }
    if (first->empty()) *first = lo;
    if (comma == std::string::npos) return true;
    start = comma + 1;
  }
}

}  // namespace detail

// The first host of a Slurm node list in its compressed form: "node[01-04,07]" -> "node01",
// "rack[1-2]-n[3-4],gpu7" -> "rack1-n3", "node07" -> "node07". Slurm starts task 0 on the first
// node of the step's list. Returns "" and sets *why when the list is malformed.
inline std::string firstSlurmHost(const std::string& list, std::string* why) {
  std::string host;
  for (size_t i = 0; i < list.size() && list[i] != ','; ++i) {
    const char c = list[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      *why = "contains white space";
      return "";
    }
    if (c == ']') {
      *why = "']' at offset " + std::to_string(i) + " has no matching '['";
      return "";
    }
    if (c != '[') {
      host += c;
      continue;
    }
    const size_t close = list.find(']', i);
    if (close == std::string::npos) {
      *why = "'[' at offset " + std::to_string(i) + " is not closed";
      return "";
    }
    std::string first;
    if (!detail::firstOfRange(list.substr(i + 1, close - i - 1), &first, why)) return "";
    host += first;
    i = close;
  }
  if (host.empty()) *why = "its first entry is empty";
  return host;
}

}  // namespace loom::api
