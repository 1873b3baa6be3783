#include "npz_arrays.h"

#include <bit>
#include <cstring>
#include <regex>

#include "bad_input.h"

namespace dlrm {
namespace {

constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kDirectoryEntry = 0x02014b50;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kSaturated32 = 0xFFFFFFFF;
constexpr uint16_t kZip64Extra = 0x0001;

// Little-endian fields of the archive, every read bounds-checked.
class Bytes {
 public:
  Bytes(const std::string& data, const std::string& path) : data_(data), path_(path) {}

  uint64_t read(uint64_t at, int width) const {
    if (at > data_.size() || data_.size() - at < static_cast<uint64_t>(width)) fail("truncated");
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; --i) value = value << 8 | static_cast<unsigned char>(data_[at + i]);
    return value;
  }
  std::string slice(uint64_t at, uint64_t size) const {
    if (at > data_.size() || data_.size() - at < size) fail("truncated");
    return data_.substr(at, size);
  }
  size_t size() const { return data_.size(); }
  [[noreturn]] void fail(const std::string& what) const {
    throw BadInput(path_ + ": not the model's vocabulary (" + what + ")");
  }

 private:
  const std::string& data_;
  const std::string& path_;
};

struct Member {
  uint16_t method;
  uint64_t size;
  uint64_t local_header;
};

// The central directory's entry for ``member``: its compression, size and header offset.
Member find_member(const Bytes& zip, const std::string& member) {
  // The end-of-directory record is in the last 22 + 65535 (comment) bytes.
  uint64_t end = zip.size() < 22 ? zip.size() : zip.size() - 22;
  uint64_t lowest = zip.size() > 22 + 65535 ? zip.size() - 22 - 65535 : 0;
  while (true) {
    if (zip.size() < 22 || end < lowest) zip.fail("no zip directory");
    if (zip.read(end, 4) == kEndOfDirectory) break;
    if (end == 0) zip.fail("no zip directory");
    --end;
  }
  uint64_t count = zip.read(end + 10, 2), directory = zip.read(end + 16, 4);
  if ((count == 0xFFFF || directory == kSaturated32) && end >= 20 && zip.read(end - 20, 4) == kZip64Locator) {
    uint64_t record = zip.read(end - 20 + 8, 8);
    if (zip.read(record, 4) != kZip64EndOfDirectory) zip.fail("bad zip64 directory");
    count = zip.read(record + 32, 8);
    directory = zip.read(record + 48, 8);
  }
  uint64_t at = directory;
  for (uint64_t i = 0; i < count; ++i) {
    if (zip.read(at, 4) != kDirectoryEntry) zip.fail("bad zip directory entry");
    Member found{static_cast<uint16_t>(zip.read(at + 10, 2)), zip.read(at + 24, 4), zip.read(at + 42, 4)};
    uint64_t name_size = zip.read(at + 28, 2), extra_size = zip.read(at + 30, 2), comment_size = zip.read(at + 32, 2);
    std::string name = zip.slice(at + 46, name_size);
    if (name == member) {
      // Saturated sizes and offset are in the zip64 extra field, in this order.
      uint64_t extra = at + 46 + name_size, extra_end = extra + extra_size;
      while (extra + 4 <= extra_end) {
        uint64_t id = zip.read(extra, 2), length = zip.read(extra + 2, 2);
        if (id == kZip64Extra) {
          uint64_t field = extra + 4;
          if (found.size == kSaturated32) { found.size = zip.read(field, 8); field += 8; }
          if (zip.read(at + 20, 4) == kSaturated32) field += 8;  // the compressed size
          if (found.local_header == kSaturated32) found.local_header = zip.read(field, 8);
        }
        extra += 4 + length;
      }
      return found;
    }
    at += 46 + name_size + extra_size + comment_size;
  }
  zip.fail("no array " + member);
}

}  // namespace

std::vector<uint32_t> npz_uint32_array(const std::string& archive, const std::string& path, const std::string& name) {
  Bytes zip(archive, path);
  std::string member = name + ".npy";
  Member found = find_member(zip, member);
  if (found.method != 0) zip.fail(member + " is compressed; numpy.savez stores arrays uncompressed");
  if (zip.read(found.local_header, 4) != kLocalHeader) zip.fail("bad zip header of " + member);
  uint64_t data = found.local_header + 30 + zip.read(found.local_header + 26, 2) + zip.read(found.local_header + 28, 2);
  std::string npy = zip.slice(data, found.size);
  // .npy: magic, version, header length (2 bytes in version 1, 4 after), a dict literal.
  if (npy.size() < 10 || npy.compare(0, 6, "\x93NUMPY") != 0) zip.fail(member + " is not a .npy array");
  Bytes header_bytes(npy, path);
  int major = static_cast<unsigned char>(npy[6]);
  uint64_t header_size = major == 1 ? header_bytes.read(8, 2) : header_bytes.read(8, 4);
  uint64_t header_at = major == 1 ? 10 : 12;
  std::string header = header_bytes.slice(header_at, header_size);
  std::smatch shape;
  static const std::regex kUint32Vector(
      R"(^\{'descr': '<u4', 'fortran_order': False, 'shape': \((\d{1,12}),\), \}\s*$)");
  if (!std::regex_match(header, shape, kUint32Vector)) zip.fail(member + " is not a 1-D uint32 array");
  uint64_t length = std::stoull(shape[1].str());
  uint64_t body = header_at + header_size;
  if (npy.size() - body != length * sizeof(uint32_t)) zip.fail(member + " has a size its header does not give");
  std::vector<uint32_t> values(length);
  static_assert(std::endian::native == std::endian::little, "the arrays are copied as stored: little-endian");
  std::memcpy(values.data(), npy.data() + body, length * sizeof(uint32_t));
  return values;
}

}  // namespace dlrm
