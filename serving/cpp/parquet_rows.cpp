#include "parquet_rows.h"

#include <cmath>
#include <cstdio>

#include "id_hash.h"  // data/parquet/native/: the trainer's hash (the Makefile adds the folder)
#include "bad_input.h"

namespace dlrm {
namespace {

// serving/model_inputs.py PADDING_ID: a place its bag leaves empty.
constexpr int64_t kPaddingId = -1;

const JsonValue& member(const JsonValue& object, const std::string& key, const std::string& path) {
  const JsonValue* value = object.find(key);
  if (value == nullptr) throw BadInput(path + ": " + key + " is missing");
  return *value;
}

std::vector<std::string> names(const JsonValue& inputs, const std::string& key, const std::string& path) {
  std::vector<std::string> result;
  for (const JsonValue& item : member(inputs, key, path).array(path, key)) result.push_back(item.text(path, key));
  return result;
}

// A double as Python's repr prints it in a message (nan, inf, -inf are all it is asked for).
std::string python_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", x);
  return text;
}

}  // namespace

ParquetRows::ParquetRows(const JsonValue& inputs, const std::string& path) {
  dense_ = names(inputs, "dense_feature_names", path);
  std::vector<std::string> sparse = names(inputs, "sparse_feature_names", path);
  auto hotness = member(inputs, "sparse_hotness", path).integers(path, "sparse_hotness", sparse.size(), 1);
  auto table_sizes = member(inputs, "num_embeddings_per_feature", path)
                         .integers(path, "num_embeddings_per_feature", sparse.size(), 1);
  const JsonValue& preprocessing = member(inputs, "preprocessing", path);
  preprocessing.object(path, "preprocessing");
  const std::string& transform = member(preprocessing, "dense_transform", path).text(path, "dense_transform");
  const std::string& hashing = member(preprocessing, "id_hashing", path).text(path, "id_hashing");
  if (transform != "log1p" && transform != "none") throw BadInput(path + ": dense_transform must be log1p or none");
  if (hashing != "hash" && hashing != "modulo") throw BadInput(path + ": id_hashing must be hash or modulo");
  log1p_ = transform == "log1p";
  modulo_ = hashing == "modulo";
  uint64_t seed = 0;
  if (!member(preprocessing, "hash_seed", path).bits(&seed) ||
      member(preprocessing, "hash_seed", path).number() < 0) {
    throw BadInput(path + ": hash_seed must be an integer from 0 to 2^64 - 1");
  }
  salt_ = dlrm_salt(seed);
  const auto& types = member(preprocessing, "sparse_value_types", path).array(path, "sparse_value_types");
  if (types.size() != sparse.size()) throw BadInput(path + ": sparse_value_types must name every sparse column");
  for (size_t f = 0; f < sparse.size(); ++f) {
    const std::string& type = types[f].text(path, "sparse_value_types");
    if (type != "integer" && type != "string" && type != "integer_list" && type != "string_list") {
      throw BadInput(path + ": sparse_value_types: " + type + " is not integer, string, integer_list or string_list");
    }
    bool list = type.size() > 5 && type.compare(type.size() - 5, 5, "_list") == 0;
    if (!list && hotness[f] != 1) throw BadInput(path + ": sparse_hotness of " + sparse[f] + " must be 1");
    sparse_.push_back({sparse[f], type.rfind("integer", 0) == 0, list, hotness[f], static_cast<uint64_t>(table_sizes[f])});
    places_total_ += hotness[f];
  }
}

bool ParquetRows::is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
}

void ParquetRows::read_line(const std::string& line, const std::string& source, int64_t number, float* dense,
                            int64_t* ids) const {
  std::string where = source + " line " + std::to_string(number);
  JsonValue row = JsonValue::parse(line, where);
  if (row.kind() != JsonValue::Kind::kObject) {
    throw BadInput(where + ": expected a JSON object keyed by column name");
  }
  auto refuse = [&](const std::string& column, const std::string& what) {
    throw BadInput(where + " column " + column + ": " + what);
  };
  auto value_of = [&](const std::string& column) -> const JsonValue& {
    const JsonValue* value = row.find(column);
    if (value == nullptr) refuse(column, "missing (send null for a missing value)");
    return *value;
  };
  for (size_t j = 0; j < dense_.size(); ++j) {
    const JsonValue& value = value_of(dense_[j]);
    double x = 0.0;
    if (value.kind() == JsonValue::Kind::kNumber) {
      x = value.number();
    } else if (!value.is_null()) {
      refuse(dense_[j], "expected a number or null");
    }
    if (!std::isfinite(x)) refuse(dense_[j], "dense value " + python_float(x) + " is not finite");
    if (log1p_) x = std::log1p(x > 0.0 ? x : 0.0);  // -0.0 -> +0.0, as numpy.maximum(x, 0.0)
    dense[j] = static_cast<float>(x);
  }
  int64_t* place = ids;
  for (const Sparse& feature : sparse_) {
    const JsonValue& value = value_of(feature.name);
    std::string expected = std::string("expected ") +
                           (feature.integer ? (feature.list ? "a list of integer ids, or null" : "an integer id or null")
                                            : (feature.list ? "a list of string ids, or null" : "a string id or null"));
    std::vector<const JsonValue*> bag;
    if (feature.list && value.kind() == JsonValue::Kind::kArray) {
      for (const JsonValue& item : value.items()) bag.push_back(&item);
    } else if (!feature.list && !value.is_null()) {
      bag.push_back(&value);
    } else if (!value.is_null()) {
      refuse(feature.name, expected);
    }
    int64_t filled = 0;
    for (const JsonValue* item : bag) {
      if (item->is_null() && feature.list) continue;  // a null inside a list is left out
      uint64_t key = 0;
      if (feature.integer) {
        if (!item->bits(&key)) refuse(feature.name, expected);
      } else {
        if (item->kind() != JsonValue::Kind::kString) refuse(feature.name, expected);
        const std::string& text = item->text(where, feature.name);
        key = dlrm_string_key(reinterpret_cast<const uint8_t*>(text.data()), text.size());
      }
      if (filled == feature.places) {
        int64_t size = 0;
        for (const JsonValue* counted : bag) size += !counted->is_null();
        refuse(feature.name, "a bag of " + std::to_string(size) + " ids, more than the " +
                                 std::to_string(feature.places) +
                                 " places the model was exported with (serving.export --max_bag_size)");
      }
      int64_t id = static_cast<int64_t>(key);
      if (modulo_ && id < 0) refuse(feature.name, "id " + std::to_string(id) + " is negative (--id_hashing modulo)");
      place[filled++] = modulo_ ? id % static_cast<int64_t>(feature.table_size)
                                : dlrm_embedding_row(key, salt_, feature.table_size);
    }
    for (int64_t p = filled; p < feature.places; ++p) place[p] = kPaddingId;
    place += feature.places;
  }
}

}  // namespace dlrm
