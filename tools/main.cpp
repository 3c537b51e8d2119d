#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "sparsejit/sparsejit.h"
int main(int argc, char** argv) {
  CLI::App app{"sjit"};
  CLI11_PARSE(app, argc, argv);
  return 0;
}
