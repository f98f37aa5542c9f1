// What the subcommands' CLI11 tables share: parsing with one-line errors and the flag list completion offers.
#pragma once
#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "castor/sample.h"

namespace castor::train {

// Parses `args` (argv after the subcommand); CLI11's errors become one castor::Error line, "--flag: problem".
void parse_flags(CLI::App& app, std::vector<std::string> args, const std::string& command);
// "--a --b ..." of every long flag of `app`.
std::string flag_words(const CLI::App& app);

// The tables of `castor sample` and `castor export` (src/train/sample.cpp), for completion.
std::unique_ptr<CLI::App> sample_app(SampleConfig& c);
std::unique_ptr<CLI::App> export_app(ExportConfig& c);

}  // namespace castor::train
