// Status and Result: how errors travel inside Loom.
//
// Every fallible internal function returns a [[nodiscard]] Status (a code from
// loom.h, a message, and the file:line where it was made) or a Result<T>.
// LOOM_CHECK propagates a failure and logs a "-> code at file:line" trail at
// TRACE level on the way up, so a failure can be followed without a debugger.
// Exceptions never cross the C API: src/api wraps every entry in a guard.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <variant>

#include "loom/loom.h"

namespace loom {

// Success is a null pointer: the common case constructs, moves and destroys as one word, and
// only a failure allocates its code, message and place.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(loomResult_t code, std::string message, const char* file = "", int line = 0)
      : rep_(code == loomSuccess && message.empty()
                 ? nullptr
                 : new Rep{code, std::move(message), file, line}) {}
  Status(const Status& o) : rep_(o.rep_ ? new Rep(*o.rep_) : nullptr) {}
  Status(Status&&) noexcept = default;
  Status& operator=(const Status& o) {
    if (this != &o) rep_.reset(o.rep_ ? new Rep(*o.rep_) : nullptr);
    return *this;
  }
  Status& operator=(Status&&) noexcept = default;

  static Status ok() { return Status(); }
  bool isOk() const { return rep_ == nullptr || rep_->code == loomSuccess; }
  explicit operator bool() const { return isOk(); }
  loomResult_t code() const { return rep_ ? rep_->code : loomSuccess; }
  const std::string& message() const { return rep_ ? rep_->message : kNoMessage; }
  const char* file() const { return rep_ ? rep_->file : ""; }
  int line() const { return rep_ ? rep_->line : 0; }
  // Prepends context to the message ("allreduce #12: " + message).
  Status& prefix(const std::string& context) {
    if (!rep_) rep_.reset(new Rep{loomSuccess, std::string(), "", 0});
    rep_->message = context + rep_->message;
    return *this;
  }

 private:
  struct Rep {
    loomResult_t code;
    std::string message;
    const char* file;
    int line;
  };
  static inline const std::string kNoMessage;
  std::unique_ptr<Rep> rep_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT
  bool isOk() const { return v_.index() == 0; }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T&& take() { return std::move(std::get<0>(v_)); }
  Status status() const { return isOk() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

// Logs one trail line for a failure passing through file:line (TRACE level).
void logTrail(const Status& s, const char* file, int line);

}  // namespace loom

#define LOOM_ERROR(code, msg) ::loom::Status((code), (msg), __FILE__, __LINE__)

#define LOOM_CHECK(expr)                             \
  do {                                               \
    ::loom::Status loom_s_ = (expr);                 \
    if (!loom_s_.isOk()) {                           \
      ::loom::logTrail(loom_s_, __FILE__, __LINE__); \
      return loom_s_;                                \
    }                                                \
  } while (0)

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)
// LOOM_ASSIGN(auto x, f()): unwraps a Result<T> or returns its Status.
#define LOOM_ASSIGN(decl, expr) LOOM_ASSIGN_IMPL(LOOM_CONCAT(loom_r_, __LINE__), decl, expr)
#define LOOM_ASSIGN_IMPL(tmp, decl, expr)               \
  auto tmp = (expr);                                    \
  if (!tmp.isOk()) {                                    \
    ::loom::logTrail(tmp.status(), __FILE__, __LINE__); \
    return tmp.status();                                \
  }                                                     \
  decl = tmp.take()
