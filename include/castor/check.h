// The two error tiers: CASTOR_CHECK throws castor::Error for user errors; CASTOR_ASSERT aborts on broken invariants.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace castor {

// A user error (bad shape, dtype, file, flag): the message names the op or file and the offending values.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void assert_fail(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace castor

#define CASTOR_CHECK(cond, ...)                                             \
  do {                                                                      \
    if (!(cond)) throw ::castor::Error(::castor::detail::cat(__VA_ARGS__)); \
  } while (0)

#define CASTOR_ASSERT(cond, ...)                                                                               \
  do {                                                                                                         \
    if (!(cond)) ::castor::detail::assert_fail(#cond, __FILE__, __LINE__, ::castor::detail::cat(__VA_ARGS__)); \
  } while (0)
