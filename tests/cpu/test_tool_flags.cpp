// `sjit bench` and `sjit check` check their flags before they look for a GPU, so a bad one is refused
// here too, with the flag, its value and what is allowed.
#include <catch2/catch.hpp>

#include <span>
#include <utility>

#include "sparsejit/device.h"
#include "support/run_tool.h"

using Catch::Matchers::Contains;

namespace {

using Refusal = std::pair<const char*, const char*>;  // the tool's arguments, a part of its message

// Each command fails, saying its part.
void expect_refused(std::span<const Refusal> refusals) {
  for (const auto& [args, message] : refusals) {
    int status = 0;
    const std::string out = sjit::test::run_tool(args, &status);
    INFO(args);
    CHECK(status != 0);
    CHECK_THAT(out, Contains(message));
  }
}

// expect_refused, and without a GPU, `good` (flags that are all fine) gets as far as the GPU's absence,
// which `no_gpu` names.
void expect_refusals(std::span<const Refusal> refusals, const char* good, const char* no_gpu) {
  expect_refused(refusals);
  if (!sjit::gpu_available()) {
    int status = 0;
    const std::string out = sjit::test::run_tool(good, &status);
    INFO(good);
    CHECK(status != 0);
    CHECK_THAT(out, Contains(no_gpu));
  }
}

}  // namespace

TEST_CASE("sjit bench attention refuses a bad --walk or --query-tiles, and backward flags without --backward",
          "[tool][attention][backward]") {
  const Refusal refusals[] = {
      {"bench attention --backward --walk sideways", "--walk sideways: use tiles, packed or gathered"},
      {"bench attention --backward --query-tiles 96", "--query-tiles 96: use 64 or 128"},
      {"bench attention --walk packed", "choose how the backward runs: add --backward"},
      {"bench attention --query-tiles 64", "choose how the backward runs: add --backward"},
      {"bench attention --dq atomic", "choose how the backward runs: add --backward"},
  };
  expect_refused(refusals);
}

TEST_CASE("sjit check refuses a bad spec, shape, tiling or count before it looks for a GPU", "[tool]") {
  const Refusal refusals[] = {
      {"check foo:x", "spec 'foo:x': the op comes first, rownorm:, attention: or e23:"},
      {"check attention:d=63", "head_dim = 63"},
      {"check attention:d=64 --shape 1,2", "--shape has 2 numbers: give B,Hq,Hkv,Sq,Sk"},
      {"check attention:d=64 --config bogus=1", "--config bogus=1:"},
      {"check rownorm:kind=softmax,n=64 --rows 0", "--rows 0: give at least 1"},
      {"check attention:d=64,sparsity=bsr,block=64 --density 2", "--density 2: give a density in (0, 1]"},
  };
  expect_refusals(refusals, "check rownorm:kind=softmax,n=64", "sjit check needs a GPU");
}

TEST_CASE("sjit bench refuses bad sizes, counts, kinds and patterns before it looks for a GPU", "[tool]") {
  // Each refusal names the flag or field and its value. (With a GPU, `--iters 0` used to take the
  // median of no runs, and `bench rownorm --n 0` to divide by zero.)
  const Refusal refusals[] = {
      {"bench attention --iters 0", "--iters 0: give at least 1"},
      {"bench attention --warmup -1", "--warmup -1: give at least 0"},
      {"bench attention --batch 0", "--batch 0: give at least 1"},
      {"bench attention --seq -5", "--seq -5: give at least 1"},
      {"bench attention --heads 6 --heads-kv 4", "--heads 6 --heads-kv 4: the query heads must be a multiple"},
      {"bench attention --d 48", "head_dim = 48"},
      {"bench attention --dtype f32", "dtype = f32"},
      {"bench attention --causal up", "--causal up: use none, tl or br"},
      {"bench attention --density 0.1,2", "density = 2"},
      {"bench attention --density 0.1 --block 7", "block_size = 7"},
      {"bench attention --window 2,-1", "blocks_after = -1"},
      {"bench attention --config bogus=1", "--config bogus=1:"},
      {"bench rownorm --n 8,0", "n = 0"},
      {"bench rownorm --iters 0", "--iters 0: give at least 1"},
      {"bench rownorm --elements 0", "--elements 0: give 1 to 2^40"},
      {"bench rownorm --kinds softmax,foo", "kind 'foo' is unknown"},
      {"bench e23 --steps 0", "--steps 0: give at least 1"},
      {"bench e23 --dim 12", "dim = 12"},
      {"bench e23 --slots 100000", "n_slots = 100000"},
      {"bench e23 --checkpoint-every -2", "--checkpoint-every -2: give at least 0"},
  };
  expect_refusals(refusals, "bench attention --seq 256 --density 0.5", "sjit bench needs a GPU");
}
