// CLI11 parsing shared by the subcommands: one-line errors and completion's flag lists.
#include "train/cli.h"

#include <algorithm>

#include "castor/check.h"

namespace castor::train {

void parse_flags(CLI::App& app, std::vector<std::string> args, const std::string& command) {
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last-first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      msg = "unknown flag '" + msg.substr(msg.find(": ") + 2) + "' (see castor " + command + " --help)";
    } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
      msg = msg.substr(0, msg.find(':')) + ": missing value";
    } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
      // CLI11: "Could not convert: --flag = value"
      const size_t at = msg.find("--"), eq = msg.find(" = ");
      if (at != std::string::npos && eq != std::string::npos)
        msg = msg.substr(at, eq - at) + ": invalid value '" + msg.substr(eq + 3) + "' (see castor " + command + " --help)";
    }
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    throw Error(msg);
  }
}

std::string flag_words(const CLI::App& app) {
  std::string w;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& name : o->get_lnames()) w += (w.empty() ? "--" : " --") + name;
  return w;
}

}  // namespace castor::train
