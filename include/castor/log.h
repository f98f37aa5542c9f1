// Library warnings go through one hook the application can redirect or silence (by default: stderr).
#pragma once
#include <functional>
#include <string>

namespace castor {

// Receives each warning the library gives, one line without a trailing newline.
using LogHandler = std::function<void(const std::string& message)>;

// Installs `handler` (an empty one silences warnings) and returns the one it replaces. The default handler
// writes "castor: warning: MESSAGE" to stderr.
LogHandler set_log_handler(LogHandler handler);

// Passes `message` to the installed handler (thread-safe).
void warn(const std::string& message);

}  // namespace castor
