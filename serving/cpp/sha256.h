// SHA-256 (FIPS 180-4), to check the model directory's files against its manifest.json
// as the Python loaders do (common/manifest.py).
#pragma once

#include <string>

namespace dlrm {

// The lowercase hexadecimal SHA-256 of ``data``.
std::string sha256_hex(const std::string& data);

}  // namespace dlrm
