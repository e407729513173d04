// The library's version. This is the one place it is written: CMake's project() and the Python
// package's metadata read it from here.
#pragma once

#define TILEATTN_VERSION_MAJOR 0
#define TILEATTN_VERSION_MINOR 1
#define TILEATTN_VERSION_PATCH 0
#define TILEATTN_VERSION_STRING "0.1.0"

namespace tileattn {
inline constexpr int version_major = TILEATTN_VERSION_MAJOR;
inline constexpr int version_minor = TILEATTN_VERSION_MINOR;
inline constexpr int version_patch = TILEATTN_VERSION_PATCH;
inline constexpr const char* version_string = TILEATTN_VERSION_STRING;
}  // namespace tileattn
