// dlrm_predict: click probabilities of raw Criteo lines, or of JSON rows of a model
// trained on Parquet, from the AOTInductor package of a model directory written by
// ``python -m serving.export --format aoti``.
//
//   dlrm_predict MODEL_DIR [--batch_size N] [--num_threads N] < lines > probabilities
//
// Reads the lines of the model's input layout on stdin: raw Criteo lines (labelled or
// not, judged by the first line) with the transforms inputs.json names (criteo_lines.h),
// or, for a Parquet model, one JSON object of its columns per line, hashed and
// transformed as its training did (parquet_rows.h). Runs MODEL_DIR/fp32.aoti.pt2 on
// each --batch_size rows as soon as they are read and prints one probability per line
// ("%.7g", as serving.predict). inputs.json, the vocabulary and the package are checked
// against manifest.json (size and SHA-256) before use. Loading the package runs the
// native code it holds: give it only model directories you trust. Bad input (a model
// directory it cannot serve, a malformed line): one line "dlrm_predict: error: ..." on
// stderr, exit 2; the probabilities of the batches before a malformed line's are printed.
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bad_input.h"
#include "criteo_lines.h"
#include "json_value.h"
#include "npz_arrays.h"
#include "parquet_rows.h"
#include "sha256.h"

namespace dlrm {
namespace {

constexpr const char* kProgram = "dlrm_predict";
constexpr const char* kPackageFile = "fp32.aoti.pt2";
constexpr const char* kInputsFile = "inputs.json";
constexpr const char* kManifestFile = "manifest.json";
// Version 3 adds the calibration the model files apply themselves: nothing to read here.
constexpr int64_t kInputsVersion = 4;
constexpr int64_t kOldestInputsVersion = 2;
constexpr const char* kCriteoLayout = "criteo_raw";
constexpr const char* kParquetLayout = "parquet_columns";
// The largest batch of the exported program's dynamic dimension (serving/export.py export_program).
constexpr int64_t kMaxBatchSize = int64_t(1) << 24;
constexpr const char* kUsage = "usage: dlrm_predict MODEL_DIR [--batch_size N] [--num_threads N] < lines";

struct Options {
  std::string model_dir;
  int64_t batch_size = 4096;
  int num_threads = 0;  // 0: torch's default
};

int64_t positive_flag(const std::string& flag, const std::string& value) {
  size_t used = 0;
  int64_t parsed = 0;
  try {
    parsed = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || parsed <= 0) throw BadInput("argument " + flag + ": must be a positive integer, got " + value);
  return parsed;
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--batch_size" || arg == "--num_threads") {
      if (i + 1 >= argc) throw BadInput("argument " + arg + ": expected a value");
      int64_t value = positive_flag(arg, argv[++i]);
      if (arg == "--batch_size" && value > kMaxBatchSize) {
        throw BadInput("argument --batch_size: at most " + std::to_string(kMaxBatchSize) +
                       " (the exported program's largest batch), got " + std::to_string(value));
      }
      if (arg == "--batch_size") options.batch_size = value;
      else options.num_threads = static_cast<int>(std::min<int64_t>(value, 1 << 16));
    } else if (arg.rfind("--", 0) == 0 || !options.model_dir.empty()) {
      throw BadInput("unrecognized argument " + arg + " (" + kUsage + ")");
    } else {
      options.model_dir = arg;
    }
  }
  if (options.model_dir.empty()) throw BadInput(std::string("the model directory is required (") + kUsage + ")");
  return options;
}

// A model directory's files, each checked against its manifest before use, as the
// Python loaders check them (serving/model_files.py read_file).
class ModelDirectory {
 public:
  explicit ModelDirectory(std::string path) : path_(std::move(path)) {
    if (!std::filesystem::is_directory(path_)) throw BadInput(path_ + ": no such directory");
    std::string manifest_path = file_path(kManifestFile);
    if (!std::filesystem::exists(manifest_path)) {
      throw BadInput(manifest_path + ": missing (python -m serving.export writes it last: the export is incomplete)");
    }
    JsonValue manifest = JsonValue::parse(read_bytes(manifest_path), manifest_path);
    const JsonValue* files = manifest.find("files");
    if (files == nullptr) throw BadInput(manifest_path + ": files is missing");
    for (const auto& [name, entry] : files->object(manifest_path, "files")) {
      const JsonValue* bytes = entry.find("bytes");
      const JsonValue* digest = entry.find("sha256");
      if (bytes == nullptr || digest == nullptr) throw BadInput(manifest_path + ": files." + name + " needs bytes and sha256");
      entries_[name] = {bytes->integer(manifest_path, "files." + name + ".bytes"),
                        digest->text(manifest_path, "files." + name + ".sha256")};
    }
  }

  const std::string& path() const { return path_; }
  std::string file_path(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

  // The bytes of the file ``name``, checked against the manifest.
  std::string read(const std::string& name) const {
    std::string where = file_path(name);
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw BadInput(path_ + ": file name '" + name + "' is not a plain name in the directory");
    }
    std::string data = read_bytes(where);
    auto entry = entries_.find(name);
    if (entry == entries_.end()) throw BadInput(where + ": not listed in the manifest, refusing to load it");
    if (static_cast<int64_t>(data.size()) != entry->second.bytes) {
      throw BadInput(where + ": " + std::to_string(data.size()) + " bytes, the manifest says " +
                     std::to_string(entry->second.bytes) + ": the file is truncated or damaged");
    }
    if (sha256_hex(data) != entry->second.sha256) {
      throw BadInput(where + ": its SHA-256 differs from the manifest's: the file is damaged");
    }
    return data;
  }

 private:
  struct Entry {
    int64_t bytes;
    std::string sha256;
  };
  std::string path_;
  std::map<std::string, Entry> entries_;

  static std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw BadInput(path + ": missing or unreadable");
    std::ostringstream data;
    data << in.rdbuf();
    return data.str();
  }
};

const JsonValue& member(const JsonValue& object, const std::string& key, const std::string& path) {
  const JsonValue* value = object.find(key);
  if (value == nullptr) throw BadInput(path + ": " + key + " is missing");
  return *value;
}

// One line of input -> one row of the model's inputs.
class RowReader {
 public:
  virtual ~RowReader() = default;
  virtual int64_t dense_width() const = 0;
  virtual int64_t ids_width() const = 0;
  // Writes line ``number``'s row; false when the line holds none (skipped).
  virtual bool read(const std::string& line, int64_t number, float* dense, int64_t* ids) = 0;
};

class CriteoReader : public RowReader {
 public:
  explicit CriteoReader(CriteoLines lines) : lines_(std::move(lines)) {}
  int64_t dense_width() const override { return kNumDenseFeatures; }
  int64_t ids_width() const override { return kNumSparseFeatures; }
  bool read(const std::string& line, int64_t number, float* dense, int64_t* ids) override {
    if (number == 1) labelled_ = CriteoLines::is_labelled(line);
    lines_.read_line(line, labelled_, "stdin", number, dense, ids);
    return true;
  }

 private:
  CriteoLines lines_;
  bool labelled_ = false;
};

class ParquetReader : public RowReader {
 public:
  explicit ParquetReader(ParquetRows rows) : rows_(std::move(rows)) {}
  int64_t dense_width() const override { return rows_.dense_width(); }
  int64_t ids_width() const override { return rows_.ids_width(); }
  bool read(const std::string& line, int64_t number, float* dense, int64_t* ids) override {
    if (ParquetRows::is_blank(line)) return false;
    rows_.read_line(line, "stdin", number, dense, ids);
    return true;
  }

 private:
  ParquetRows rows_;
};

CriteoLines read_criteo_layout(const ModelDirectory& model, const JsonValue& inputs, const std::string& path);

// The reader of the layout inputs.json describes (raw Criteo lines, or a Parquet model's
// JSON rows); refuses any other layout in one line.
std::unique_ptr<RowReader> read_layout(const ModelDirectory& model) {
  std::string path = model.file_path(kInputsFile);
  JsonValue inputs = JsonValue::parse(model.read(kInputsFile), path);
  int64_t version = member(inputs, "version", path).integer(path, "version");
  if (version < kOldestInputsVersion || version > kInputsVersion) {
    throw BadInput(path + ": version " + std::to_string(version) + ", this program reads versions " +
                   std::to_string(kOldestInputsVersion) + " to " + std::to_string(kInputsVersion) +
                   " (export the model again with python -m serving.export)");
  }
  // Version 4's histories: the jagged history inputs of a --sequence_columns model are not read here.
  if (const JsonValue* histories = inputs.find("histories")) {
    std::string names;
    for (const JsonValue& history : histories->array(path, "histories")) {
      const JsonValue* name = history.find("name");
      names += (names.empty() ? "" : ", ") + (name ? name->text(path, "histories[].name") : std::string("?"));
    }
    if (!names.empty()) {
      throw BadInput(model.path() + ": a model with history features (" + names +
                     "); dlrm_predict does not read histories: serve it with python -m serving.predict or "
                     "python -m serving.serve");
    }
  }
  const std::string& layout = member(inputs, "layout", path).text(path, "layout");
  if (layout == kParquetLayout) return std::make_unique<ParquetReader>(ParquetRows(inputs, path));
  if (layout != kCriteoLayout) {
    throw BadInput(model.path() + ": its input layout is " + layout + "; dlrm_predict reads raw Criteo lines (" +
                   kCriteoLayout + ") and a Parquet model's JSON rows (" + kParquetLayout +
                   ") only: serve this model with python -m serving.predict");
  }
  return std::make_unique<CriteoReader>(read_criteo_layout(model, inputs, path));
}

CriteoLines read_criteo_layout(const ModelDirectory& model, const JsonValue& inputs, const std::string& path) {
  size_t dense = member(inputs, "dense_feature_names", path).array(path, "dense_feature_names").size();
  if (dense != kNumDenseFeatures) {
    throw BadInput(path + ": " + std::to_string(dense) + " dense features, raw Criteo lines have " +
                   std::to_string(kNumDenseFeatures));
  }
  auto hotness = member(inputs, "sparse_hotness", path).integers(path, "sparse_hotness", kNumSparseFeatures, 1);
  if (std::any_of(hotness.begin(), hotness.end(), [](int64_t h) { return h != 1; })) {
    throw BadInput(path + ": sparse_hotness must be 1 for every feature of raw Criteo lines");
  }
  auto table_sizes = member(inputs, "num_embeddings_per_feature", path)
                         .integers(path, "num_embeddings_per_feature", kNumSparseFeatures, 1);
  const JsonValue& preprocessing = member(inputs, "preprocessing", path);
  preprocessing.object(path, "preprocessing");
  const JsonValue& modulo_value = member(preprocessing, "modulo_num_embeddings_per_feature", path);
  std::vector<int64_t> modulo;
  if (!modulo_value.is_null()) {
    modulo = modulo_value.integers(path, "preprocessing.modulo_num_embeddings_per_feature", kNumSparseFeatures, 1);
  }
  const JsonValue& vocabulary_value = member(preprocessing, "vocabulary", path);
  std::vector<std::vector<uint32_t>> vocabulary;
  if (!vocabulary_value.is_null()) {
    const std::string& name = vocabulary_value.text(path, "preprocessing.vocabulary");
    std::string archive = model.read(name);
    for (int f = 0; f < kNumSparseFeatures; ++f) {
      vocabulary.push_back(npz_uint32_array(archive, model.file_path(name), std::to_string(f)));
      if (!std::is_sorted(vocabulary.back().begin(), vocabulary.back().end())) {
        throw BadInput(model.file_path(name) + ": not the model's vocabulary (feature " + std::to_string(f) +
                       "'s hashes are not sorted)");
      }
    }
  }
  return CriteoLines(std::move(table_sizes), std::move(modulo), std::move(vocabulary));
}

// The first line of a torch error, without its C++ backtrace.
std::string first_line(const c10::Error& e) {
  std::string message = e.what_without_backtrace();
  return message.substr(0, message.find('\n'));
}

std::unique_ptr<torch::inductor::AOTIModelPackageLoader> load_package(const ModelDirectory& model) {
  std::string path = model.file_path(kPackageFile);
  if (!std::filesystem::exists(path)) {
    throw BadInput(model.path() + " has no " + kPackageFile + ": export it with python -m serving.export --format aoti");
  }
  model.read(kPackageFile);  // its size and digest are the manifest's
  try {
    return std::make_unique<torch::inductor::AOTIModelPackageLoader>(path);
  } catch (const c10::Error& e) {
    throw BadInput(path + ": cannot be loaded (" + first_line(e) + ")");
  }
}

// Runs the model on the first ``rows`` rows of the batch and writes their probabilities.
void predict_batch(torch::inductor::AOTIModelPackageLoader& package, const std::string& package_path,
                   const RowReader& reader, std::vector<float>& dense, std::vector<int64_t>& ids, int64_t rows) {
  at::Tensor dense_t = at::from_blob(dense.data(), {rows, reader.dense_width()}, at::kFloat);
  at::Tensor ids_t = at::from_blob(ids.data(), {rows, reader.ids_width()}, at::kLong);
  std::vector<at::Tensor> outputs;
  try {
    outputs = package.run({dense_t, ids_t});
  } catch (const c10::Error& e) {  // a package of another model: its inputs have other shapes
    throw BadInput(package_path + ": cannot run on the inputs inputs.json describes (" + first_line(e) + ")");
  }
  if (outputs.size() != 1 || outputs[0].numel() != rows) {
    throw BadInput(package_path + ": does not return one probability per row");
  }
  at::Tensor probabilities = outputs[0].to(at::kFloat).contiguous();
  const float* p = probabilities.data_ptr<float>();
  std::string text;
  char number[32];
  for (int64_t i = 0; i < rows; ++i) {
    int length = std::snprintf(number, sizeof(number), "%.7g\n", static_cast<double>(p[i]));
    text.append(number, length);
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);  // a client waiting on this batch gets it now
}

int run(int argc, char** argv) {
  Options options = parse_options(argc, argv);
  ModelDirectory model(options.model_dir);
  std::unique_ptr<RowReader> reader = read_layout(model);
  const int64_t dense_width = reader->dense_width(), ids_width = reader->ids_width();
  if (options.num_threads > 0) at::set_num_threads(options.num_threads);
  auto package = load_package(model);
  std::string package_path = model.file_path(kPackageFile);
  c10::InferenceMode inference;

  std::ios::sync_with_stdio(false);
  // Grown as rows arrive: a large --batch_size costs memory only for the rows given.
  std::vector<float> dense;
  std::vector<int64_t> ids;
  std::string line;
  int64_t line_number = 0, rows = 0, capacity = 0;
  while (std::getline(std::cin, line)) {
    ++line_number;
    if (rows == capacity) {
      capacity = std::min<int64_t>(options.batch_size, std::max<int64_t>(1, 2 * rows));
      // One spare element each: a model without dense features still has a buffer.
      dense.resize(capacity * dense_width + 1);
      ids.resize(capacity * ids_width + 1);
    }
    if (!reader->read(line, line_number, &dense[rows * dense_width], &ids[rows * ids_width])) continue;
    if (++rows == options.batch_size) {
      predict_batch(*package, package_path, *reader, dense, ids, rows);
      rows = 0;
    }
  }
  if (rows > 0) predict_batch(*package, package_path, *reader, dense, ids, rows);
  return 0;
}

}  // namespace
}  // namespace dlrm

int main(int argc, char** argv) {
  try {
    return dlrm::run(argc, argv);
  } catch (const dlrm::BadInput& e) {
    std::fprintf(stderr, "%s: error: %s\n", dlrm::kProgram, e.what());
    return dlrm::kExitBadInput;
  }
}
