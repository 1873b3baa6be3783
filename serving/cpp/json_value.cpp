#include "json_value.h"

#include <cerrno>
#include <cstdlib>

#include "bad_input.h"

namespace dlrm {

// Recursive descent over RFC 8259 JSON; nesting is bounded so that a hostile file
// cannot exhaust the stack.
class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& path) : text_(text), path_(path) {}

  JsonValue document() {
    JsonValue value = parse_value(0);
    skip_space();
    if (at_ != text_.size()) fail("text after the JSON value");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;
  const std::string& text_;
  const std::string& path_;
  size_t at_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw BadInput(path_ + ": not valid JSON at byte " + std::to_string(at_) + " (" + what + ")");
  }

  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }

  bool take(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (text_.compare(at_, n, word) != 0) return false;
    at_ += n;
    return true;
  }

  JsonValue parse_value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    JsonValue value;
    char c = text_[at_];
    if (c == '{') {
      value.kind_ = JsonValue::Kind::kObject;
      ++at_;
      skip_space();
      if (take("}")) return value;
      do {
        skip_space();
        if (at_ >= text_.size() || text_[at_] != '"') fail("expected a key");
        std::string key = parse_string();
        skip_space();
        if (!take(":")) fail("expected ':'");
        value.members_[key] = parse_value(depth + 1);
        skip_space();
      } while (take(","));
      if (!take("}")) fail("expected ',' or '}'");
    } else if (c == '[') {
      value.kind_ = JsonValue::Kind::kArray;
      ++at_;
      skip_space();
      if (take("]")) return value;
      do {
        value.items_.push_back(parse_value(depth + 1));
        skip_space();
      } while (take(","));
      if (!take("]")) fail("expected ',' or ']'");
    } else if (c == '"') {
      value.kind_ = JsonValue::Kind::kString;
      value.text_ = parse_string();
    } else if (take("true") || take("false")) {
      value.kind_ = JsonValue::Kind::kBool;
      value.boolean_ = text_[at_ - 1] == 'e' && text_[at_ - 2] == 'u';
    } else if (take("null")) {
      value.kind_ = JsonValue::Kind::kNull;
    } else {
      parse_number(value);
    }
    return value;
  }

  void parse_number(JsonValue& value) {
    size_t start = at_;
    auto digits = [&] {
      size_t first = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      if (at_ == first) fail("expected a value");
    };
    if (at_ < text_.size() && text_[at_] == '-') ++at_;
    digits();
    bool integral = true;
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      digits();
      integral = false;
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      digits();
      integral = false;
    }
    std::string literal = text_.substr(start, at_ - start);
    value.kind_ = JsonValue::Kind::kNumber;
    value.number_ = std::strtod(literal.c_str(), nullptr);
    if (integral) {
      errno = 0;
      long long parsed = std::strtoll(literal.c_str(), nullptr, 10);
      value.is_integer_ = errno == 0;  // beyond int64: a number, but no integer we take
      value.integer_ = parsed;
      if (errno == ERANGE && literal[0] != '-') {  // a uint64 (an id of 64 bits): its bits
        errno = 0;
        unsigned long long bits = std::strtoull(literal.c_str(), nullptr, 10);
        value.is_bits_ = errno == 0;
        value.integer_ = static_cast<int64_t>(bits);
      }
    }
  }

  unsigned hex4() {
    if (at_ + 4 > text_.size()) fail("short \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text_[at_++];
      code <<= 4;
      if (h >= '0' && h <= '9') code |= h - '0';
      else if (h >= 'a' && h <= 'f') code |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') code |= h - 'A' + 10;
      else fail("bad \\u escape");
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string parse_string() {
    ++at_;  // the opening quote
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("unterminated string");
      char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated string");
      char e = text_[at_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = hex4();
          if (code >= 0xD800 && code < 0xDC00 && take("\\u")) {  // a surrogate pair
            unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("bad surrogate pair");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default: fail("bad escape");
      }
    }
  }
};

JsonValue JsonValue::parse(const std::string& text, const std::string& path) {
  return JsonParser(text, path).document();
}

const JsonValue* JsonValue::find(const std::string& key) const {
  if (kind_ != Kind::kObject) return nullptr;
  auto it = members_.find(key);
  return it == members_.end() ? nullptr : &it->second;
}

static BadInput wrong_kind(const std::string& path, const std::string& what, const std::string& expected) {
  return BadInput(path + ": " + what + " must be " + expected);
}

const std::string& JsonValue::text(const std::string& path, const std::string& what) const {
  if (kind_ != Kind::kString) throw wrong_kind(path, what, "a string");
  return text_;
}

int64_t JsonValue::integer(const std::string& path, const std::string& what) const {
  if (kind_ != Kind::kNumber || !is_integer_) throw wrong_kind(path, what, "an integer");
  return integer_;
}

bool JsonValue::bits(uint64_t* out) const {
  if (kind_ != Kind::kNumber || !(is_integer_ || is_bits_)) return false;
  *out = static_cast<uint64_t>(integer_);
  return true;
}

const std::vector<JsonValue>& JsonValue::array(const std::string& path, const std::string& what) const {
  if (kind_ != Kind::kArray) throw wrong_kind(path, what, "a list");
  return items_;
}

const std::map<std::string, JsonValue>& JsonValue::object(const std::string& path, const std::string& what) const {
  if (kind_ != Kind::kObject) throw wrong_kind(path, what, "an object");
  return members_;
}

std::vector<int64_t> JsonValue::integers(const std::string& path, const std::string& what, size_t length,
                                         int64_t minimum) const {
  const std::vector<JsonValue>& items = array(path, what);
  std::string expected = "a list of " + std::to_string(length) + " integers of at least " + std::to_string(minimum);
  if (items.size() != length) throw wrong_kind(path, what, expected);
  std::vector<int64_t> values;
  for (const JsonValue& item : items) {
    if (item.kind_ != Kind::kNumber || !item.is_integer_ || item.integer_ < minimum) {
      throw wrong_kind(path, what, expected);
    }
    values.push_back(item.integer_);
  }
  return values;
}

}  // namespace dlrm
