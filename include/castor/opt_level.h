// Apex's opt levels O0-O3 as a value: what amp::initialize takes and `castor train --amp` names.
#pragma once
#include <string>

namespace castor::amp {

enum class OptLevel { O0, O1, O2, O3 };
OptLevel parse_opt_level(const std::string& s);  // "O0".."O3"; raises naming the text otherwise
const char* opt_level_name(OptLevel level);

}  // namespace castor::amp
