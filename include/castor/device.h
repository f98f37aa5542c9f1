// Where a tensor lives. Only the CPU exists today; the enum is the seam for a future GPU backend.
#pragma once

namespace castor {

enum class Device { CPU };

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "?"; }

}  // namespace castor
