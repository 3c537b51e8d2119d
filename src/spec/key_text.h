// The key-text grammar shared by every spec: "op:field=value,field=value".
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace sjit::spec {

struct KeyText {
  std::string op;
  std::map<std::string, std::string, std::less<>> fields;
};

// Splits a key text; throws InvalidSpec naming the position of a malformed field or a repeated one.
KeyText split_key(std::string_view text);

// Takes a field out of `kt` (so leftovers can be reported as unknown); throws InvalidSpec if absent.
std::string take(KeyText& kt, std::string_view field);
std::string take_or(KeyText& kt, std::string_view field, std::string_view fallback);
void reject_leftovers(const KeyText& kt, std::string_view allowed);

int parse_int(std::string_view field, std::string_view text);
float parse_float(std::string_view field, std::string_view text);
std::string format_float(float value);  // shortest text that reads back to the same float

}  // namespace sjit::spec
