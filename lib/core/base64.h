// Base64 (RFC 4648) decoding: data: URLs of chat requests, images inside benchmark TSVs.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace swiftcpp {

/// Standard base64 (RFC 4648 alphabet, padding optional, no whitespace) -> bytes; nullopt when malformed.
std::optional<std::string> decode_base64(std::string_view text);

}  // namespace swiftcpp
