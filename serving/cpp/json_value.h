// The JSON the exporter writes (inputs.json, manifest.json), read into a tree. Any
// malformed document is refused with BadInput naming the file and the byte offset.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dlrm {

class JsonValue {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Parses the whole of ``text``; ``path`` names the file in errors.
  static JsonValue parse(const std::string& text, const std::string& path);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::kNull; }
  // The value of ``key`` of an object; nullptr when absent.
  const JsonValue* find(const std::string& key) const;
  // Typed views; BadInput naming ``path`` and ``what`` when the value is another kind.
  const std::string& text(const std::string& path, const std::string& what) const;
  int64_t integer(const std::string& path, const std::string& what) const;
  const std::vector<JsonValue>& array(const std::string& path, const std::string& what) const;
  // The 64 bits of an integer from -2^63 to 2^64 - 1 (a uint64 above int64's range as
  // the int64 of the same bits); false for any other value.
  bool bits(uint64_t* out) const;
  // A number's value (kNumber only).
  double number() const { return number_; }
  // The items of an array, the members of an object (empty for other kinds).
  const std::vector<JsonValue>& items() const { return items_; }
  const std::map<std::string, JsonValue>& object(const std::string& path, const std::string& what) const;
  // An array of integers of ``length`` elements, each at least ``minimum``.
  std::vector<int64_t> integers(const std::string& path, const std::string& what, size_t length,
                                int64_t minimum) const;

 private:
  friend class JsonParser;
  Kind kind_ = Kind::kNull;
  bool boolean_ = false;
  double number_ = 0;
  bool is_integer_ = false;
  bool is_bits_ = false;  // an integer above int64's range, below 2^64: integer_ holds its bits
  int64_t integer_ = 0;
  std::string text_;
  std::vector<JsonValue> items_;
  std::map<std::string, JsonValue> members_;
};

}  // namespace dlrm
