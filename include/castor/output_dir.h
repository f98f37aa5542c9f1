// Output directories written whole (a token folder, an export's model or adapter directory): which existing directory
// a writer may replace, and the replacement in one step.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace castor {

// Whether an entry (a file name) of an output directory is one its writer writes; any other entry is the user's.
using OwnsEntry = std::function<bool(const std::string& name)>;

// The rule for an output directory `dir` (the value of `flag`) that a writer of `owns`'s files (`what`, "a token
// folder") replaces whole: a missing path, or a directory (a symbolic link is refused, never followed) that is not a
// Castor run directory (.castor.lock or checkpoints/ in it) and whose every entry `owns`; other entries are refused
// (castor::Error "FLAG: DIR holds files WHAT does not (...); give another FLAG" and `remedy`, by default what is
// replaced) unless `keep_others`.
// Returns the other entries, sorted. Every error is one line naming the flag and the directory.
std::vector<std::string> check_output_dir(const std::string& flag, const std::string& dir, const OwnsEntry& owns,
                                          const std::string& what, bool keep_others = false,
                                          const std::string& remedy = "");

// Writes the directory `dir` whole: `fill(folder)` writes its files into a fresh sibling folder (.NAME.new-PID), which
// then takes dir's place in one step (renameat2 RENAME_EXCHANGE; two renames on a filesystem without it); the `keep`
// entries of the replaced folder move into the new one and the replaced folder is removed. check_output_dir's rule is
// checked again just before the switch (anything else that appeared meanwhile is refused). A failure, or a kill, leaves
// `dir` as it was; what killed writers left beside it is cleaned up by the next (a new folder removed; an old one put
// back when `dir` is missing, else removed when `owns` every entry of it). castor::Error naming `dir`.
void write_output_dir(const std::string& flag, const std::string& dir, const OwnsEntry& owns, const std::string& what,
                      const std::vector<std::string>& keep, const std::function<void(const std::string& folder)>& fill);

}  // namespace castor
