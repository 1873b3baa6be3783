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
  int64_t integer_ = 0;
  std::string text_;
  std::vector<JsonValue> items_;
  std::map<std::string, JsonValue> members_;
};

}  // namespace dlrm
