// The warning hook: a process-wide handler behind a mutex, stderr by default.
#include "castor/log.h"

#include <cstdio>
#include <mutex>

namespace castor {

namespace {

std::mutex& mutex() {
  static std::mutex m;
  return m;
}

LogHandler& handler() {
  static LogHandler h = [](const std::string& message) {
    std::fprintf(stderr, "castor: warning: %s\n", message.c_str());
  };
  return h;
}

}  // namespace

LogHandler set_log_handler(LogHandler h) {
  std::lock_guard<std::mutex> lock(mutex());
  std::swap(handler(), h);
  return h;
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex());
  if (handler()) handler()(message);
}

}  // namespace castor
