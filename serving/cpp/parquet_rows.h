// JSON rows of a model trained on Parquet -> the model's inputs, as the Python predictor
// and the HTTP endpoint convert them (serving/layouts/parquet_rows.py through
// data/parquet/columns.py), the ids hashed by the trainer's own code
// (data/parquet/native/id_hash.h):
//
//   one JSON object per line keyed by column name (blank lines skipped); every dense and
//   sparse column of the model present (null: 0 for a dense column, an empty bag for a
//   sparse one); other keys (the label, a request id) ignored. Dense: a number, read as
//   a double, refused unless finite, then log1p(max(x, 0)) (dense_transform log1p) as
//   float32. Sparse: of the value type training read (inputs.json sparse_value_types):
//   an integer id (-2^63 to 2^64 - 1: the key is its 64 bits) or a string id (the key is
//   the FNV-1a of its UTF-8 bytes), or a list of them whose null entries are left out;
//   each key's row is the seeded hash modulo the table size (id_hashing hash) or the id
//   modulo the table size (id_hashing modulo, negative ids refused). A bag's rows fill
//   its feature's sparse_hotness places, -1 (PADDING_ID) after them; a longer bag is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "json_value.h"

namespace dlrm {

class ParquetRows {
 public:
  // The layout inputs.json (parsed, at ``path``) describes; BadInput when it lies.
  ParquetRows(const JsonValue& inputs, const std::string& path);

  int64_t dense_width() const { return static_cast<int64_t>(dense_.size()); }
  int64_t ids_width() const { return places_total_; }
  // Whether a line holds no row (only blanks): skipped, as the Python layout skips it.
  static bool is_blank(const std::string& line);

  // Writes one line's (no newline) dense inputs to ``dense`` (dense_width floats) and ids
  // to ``ids`` (ids_width); BadInput "SOURCE line NUMBER column NAME: reason" (or
  // "SOURCE line NUMBER: ...") when the row is malformed or a value is refused.
  void read_line(const std::string& line, const std::string& source, int64_t number, float* dense,
                 int64_t* ids) const;

 private:
  struct Sparse {
    std::string name;
    bool integer;  // integer ids (else strings)
    bool list;
    int64_t places;
    uint64_t table_size;
  };
  std::vector<std::string> dense_;
  std::vector<Sparse> sparse_;
  bool log1p_ = true;
  bool modulo_ = false;
  uint64_t salt_ = 0;
  int64_t places_total_ = 0;
};

}  // namespace dlrm
