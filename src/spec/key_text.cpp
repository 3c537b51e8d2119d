#include "spec/key_text.h"

#include <charconv>
#include <cmath>
#include <fmt/format.h>

#include "sparsejit/error.h"

namespace sjit::spec {

KeyText split_key(std::string_view text) {
  KeyText kt;
  const auto colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0)
    throw InvalidSpec(fmt::format("spec '{}' has no op name: expected 'op:field=value,...'", text));
  kt.op = std::string(text.substr(0, colon));
  std::string_view rest = text.substr(colon + 1);
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size())
      throw InvalidSpec(fmt::format("spec '{}': field '{}' is not of the form name=value", text, item));
    const std::string name(item.substr(0, eq));
    if (!kt.fields.emplace(name, std::string(item.substr(eq + 1))).second)
      throw InvalidSpec(fmt::format("spec '{}': field '{}' appears twice", text, name));
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
    if (rest.empty()) throw InvalidSpec(fmt::format("spec '{}' ends with a comma", text));
  }
  return kt;
}

std::string take(KeyText& kt, std::string_view field) {
  const auto it = kt.fields.find(field);
  if (it == kt.fields.end()) throw InvalidSpec(fmt::format("{} spec is missing the field '{}'", kt.op, field));
  std::string value = it->second;
  kt.fields.erase(it);
  return value;
}

std::string take_or(KeyText& kt, std::string_view field, std::string_view fallback) {
  return kt.fields.contains(field) ? take(kt, field) : std::string(fallback);
}

void reject_leftovers(const KeyText& kt, std::string_view allowed) {
  if (kt.fields.empty()) return;
  throw InvalidSpec(fmt::format("{} spec has an unknown field '{}': the fields are {}", kt.op,
                                kt.fields.begin()->first, allowed));
}

int parse_int(std::string_view field, std::string_view text) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw InvalidSpec(fmt::format("field '{}' = '{}' is not an integer", field, text));
  return value;
}

float parse_float(std::string_view field, std::string_view text) {
  float value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
    throw InvalidSpec(fmt::format("field '{}' = '{}' is not a finite number", field, text));
  return value;
}

std::string format_float(float value) { return fmt::format("{}", value); }

}  // namespace sjit::spec
