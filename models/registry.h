// THE list of supported architectures (models/registry.cpp). Adding one: a spec file, its declaration and one line
// in architectures() there, one CMake line, a golden fixture and its test case (docs/adding-a-model.md).
#pragma once

#include <string>
#include <vector>

#include "core/fs.h"
#include "models/decoder/config.h"

namespace swiftcpp {

class JsonObject;

/// One model family: its config.json `model_type`, the `architectures` names it answers to, and how its
/// config maps onto the shared decoder.
struct ArchitectureSpec {
  std::string model_type;
  std::vector<std::string> architectures;
  std::string description;
  DecoderConfig (*parse_config)(const JsonObject& json);
};

/// Every supported architecture, in a fixed order.
const std::vector<ArchitectureSpec>& architectures();

/// The spec for a parsed config.json, matched by `model_type` (or, when absent, by `architectures[0]`).
/// Throws ModelError naming the file and the unknown type and listing the supported ones; ConfigError naming the
/// file and key when `architectures` is not a list of strings.
const ArchitectureSpec& find_architecture(const JsonObject& config);

/// Reads and validates `<model_dir>/config.json` into a DecoderConfig.
/// Throws IoError (missing file), FormatError (bad JSON), ConfigError (bad key), ModelError (unknown family).
DecoderConfig load_decoder_config(const fs::path& model_dir);

}  // namespace swiftcpp
