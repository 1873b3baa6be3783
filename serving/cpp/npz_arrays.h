// Arrays of a .npz file as numpy.savez writes it (a zip archive of .npy files,
// stored uncompressed): the Criteo vocabulary of an exported model directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrm {

// The 1-D little-endian uint32 array ``name`` (without ".npy") of the .npz archive
// ``archive`` (its bytes); BadInput naming ``path`` and the array when the archive
// does not hold it in that form.
std::vector<uint32_t> npz_uint32_array(const std::string& archive, const std::string& path, const std::string& name);

}  // namespace dlrm
