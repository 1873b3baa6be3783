// Bad input: what is wrong and where, said in one line (the program prints
// "dlrm_predict: error: MESSAGE" and exits 2, as the Python CLIs do: common/cli.py).
#pragma once

#include <stdexcept>
#include <string>

namespace dlrm {

constexpr int kExitBadInput = 2;

struct BadInput : std::runtime_error {
  explicit BadInput(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace dlrm
