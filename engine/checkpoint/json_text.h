// Small text helpers shared by the checkpoint files that write JSON by hand (manifest.json, the safetensors
// header) and by the messages that quote checksums.
#pragma once

#include <cstdint>
#include <string>

namespace gpt {

// `s` as a JSON string literal, quotes included ("\"", "\\" and control characters escaped).
std::string json_string(const std::string& s);
// A CRC as the manifest writes it: "0x%08x".
std::string hex32(uint32_t v);

}  // namespace gpt
