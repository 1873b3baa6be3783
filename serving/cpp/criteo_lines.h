// Raw Criteo lines -> the model's inputs, as the Python predictor turns them
// (serving/layouts/criteo_lines.py CriteoLines, data/text/criteo_tsv.py, data/preprocess/criteo_transforms.py):
//
//   label, 13 integer features, 26 hexadecimal hashes, tab-separated (40 fields), or the
//   same without the label (39 fields); any feature may be empty (0). A line is refused
//   when its field count is wrong, its label is not 0 or 1, an integer feature is not a
//   decimal integer of at most 18 digits, or a hash is not hexadecimal of at most 8.
//   dense: log(max(x, 0) + 3) as float32. ids: the hash's position in the vocabulary
//   (+1; 0 when absent) for data made with a frequency threshold, else its low 31 bits;
//   modulo the preprocessing's table sizes when it had them; modulo the model's tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrm {

constexpr int kNumDenseFeatures = 13;
constexpr int kNumSparseFeatures = 26;
constexpr int kNumFields = 1 + kNumDenseFeatures + kNumSparseFeatures;

class CriteoLines {
 public:
  // ``modulo``: the preprocessing's table sizes (empty: none); ``vocabulary``: each
  // feature's sorted kept hashes (empty: none); ``table_sizes``: the model's.
  CriteoLines(std::vector<int64_t> table_sizes, std::vector<int64_t> modulo,
              std::vector<std::vector<uint32_t>> vocabulary);

  // Whether lines carry the label, judged by the first line as the predictor does.
  static bool is_labelled(const std::string& first_line);

  // Writes one line's (no newline) dense inputs to ``dense`` (13 floats) and ids to
  // ``ids`` (26); BadInput "SOURCE line NUMBER: reason" when the line is malformed.
  void read_line(const std::string& line, bool labelled, const std::string& source, int64_t number, float* dense,
                 int64_t* ids) const;

 private:
  std::vector<int64_t> table_sizes_;
  std::vector<int64_t> modulo_;
  std::vector<std::vector<uint32_t>> vocabulary_;

  int64_t id_of_hash(int feature, uint32_t hash) const;
};

}  // namespace dlrm
