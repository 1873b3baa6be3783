#include "criteo_lines.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include "bad_input.h"

namespace dlrm {
namespace {

constexpr size_t kMaxIntDigits = 18;  // fits int64
constexpr size_t kMaxHexDigits = 8;   // 32-bit hashes
constexpr double kDenseOffset = 3.0;
constexpr uint32_t kRawIdMask = 0x7FFFFFFF;

// A decimal integer with an optional '-' (empty: 0); false when the field is not one.
bool parse_int(std::string_view field, int64_t& value) {
  bool negative = !field.empty() && field[0] == '-';
  std::string_view digits = field.substr(negative);
  if (negative && digits.empty()) return false;
  if (digits.size() > kMaxIntDigits) return false;
  int64_t magnitude = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    magnitude = magnitude * 10 + (c - '0');
  }
  value = negative ? -magnitude : magnitude;
  return true;
}

// The predictor's reason for an integer field parse_int refused.
std::string int_reason(std::string_view field, int feature) {
  std::string_view digits = field.substr(!field.empty() && field[0] == '-');
  bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits.size() > kMaxIntDigits && all_digits) {
    return "integer feature " + std::to_string(feature) + " is out of range: " + std::to_string(digits.size()) +
           " digits (at most " + std::to_string(kMaxIntDigits) + ")";
  }
  return "integer feature " + std::to_string(feature) + " is not a decimal integer";
}

// A hexadecimal hash of up to 8 digits (empty: 0); false when the field is not one.
bool parse_hex(std::string_view field, uint32_t& value) {
  if (field.size() > kMaxHexDigits) return false;
  uint32_t hash = 0;
  for (char c : field) {
    uint32_t nibble;
    if (c >= '0' && c <= '9') nibble = c - '0';
    else if (c >= 'a' && c <= 'f') nibble = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') nibble = c - 'A' + 10;
    else return false;
    hash = hash << 4 | nibble;
  }
  value = hash;
  return true;
}

}  // namespace

CriteoLines::CriteoLines(std::vector<int64_t> table_sizes, std::vector<int64_t> modulo,
                         std::vector<std::vector<uint32_t>> vocabulary)
    : table_sizes_(std::move(table_sizes)), modulo_(std::move(modulo)), vocabulary_(std::move(vocabulary)) {}

bool CriteoLines::is_labelled(const std::string& first_line) {
  return std::count(first_line.begin(), first_line.end(), '\t') != kNumFields - 2;
}

int64_t CriteoLines::id_of_hash(int feature, uint32_t hash) const {
  int64_t id;
  if (!vocabulary_.empty()) {
    const std::vector<uint32_t>& kept = vocabulary_[feature];
    auto at = std::lower_bound(kept.begin(), kept.end(), hash);
    id = at != kept.end() && *at == hash ? (at - kept.begin()) + 1 : 0;
  } else {
    id = hash & kRawIdMask;
  }
  if (!modulo_.empty()) id %= modulo_[feature];
  return id % table_sizes_[feature];  // ids are non-negative: % is Python's remainder
}

void CriteoLines::read_line(const std::string& line, bool labelled, const std::string& source, int64_t number,
                            float* dense, int64_t* ids) const {
  auto refuse = [&](const std::string& reason) { return BadInput(source + " line " + std::to_string(number) + ": " + reason); };
  std::string_view text(line);
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);  // a CRLF line ending belongs to no field
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    size_t tab = text.find('\t', start);
    fields.push_back(text.substr(start, tab == std::string_view::npos ? std::string_view::npos : tab - start));
    if (tab == std::string_view::npos) break;
    start = tab + 1;
  }
  size_t expected = kNumFields - !labelled;
  if (fields.size() != expected) {
    throw refuse("expected " + std::to_string(kNumFields) + " tab-separated fields (label, " +
                   std::to_string(kNumDenseFeatures) + " integer, " + std::to_string(kNumSparseFeatures) +
                   " categorical) or " + std::to_string(kNumFields - 1) + " without the label, found " +
                   std::to_string(fields.size()));
  }
  if (labelled && fields[0] != "0" && fields[0] != "1") throw refuse("label must be 0 or 1");
  size_t first = labelled;
  for (int f = 0; f < kNumDenseFeatures; ++f) {
    int64_t value = 0;
    if (!parse_int(fields[first + f], value)) throw refuse(int_reason(fields[first + f], f));
    // As numpy: the int64 as float64, log in float64, rounded to float32.
    dense[f] = static_cast<float>(std::log(static_cast<double>(std::max<int64_t>(value, 0)) + kDenseOffset));
  }
  for (int f = 0; f < kNumSparseFeatures; ++f) {
    uint32_t hash = 0;
    if (!parse_hex(fields[first + kNumDenseFeatures + f], hash)) {
      throw refuse("categorical feature " + std::to_string(f) + " is not a hexadecimal hash");
    }
    ids[f] = id_of_hash(f, hash);
  }
}

}  // namespace dlrm
