// Bad arguments are refused before anything is launched, with messages naming the argument and value.
#include <catch2/catch.hpp>

#include <cstdint>

#include "sparsejit/sparsejit.h"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {
// Addresses are only checked, never dereferenced, before the launch: fake ones are fine here.
void* fake(std::uintptr_t address) { return reinterpret_cast<void*>(address); }
}  // namespace

TEST_CASE("forward arguments are checked", "[args]") {
  RowNorm op(softmax_spec(64));
  CHECK_THROWS_WITH(op.forward({nullptr, fake(4096), 10}), Contains("x is a null pointer"));
  CHECK_THROWS_WITH(op.forward({fake(4096), nullptr, 10}), Contains("y is a null pointer"));
  CHECK_THROWS_WITH(op.forward({fake(4096), fake(1 << 20), -1}), Contains("rows = -1"));
  CHECK_THROWS_WITH(op.forward({fake(4096), fake(1 << 20), 10, 32}), Contains("x has row stride 32"));
  CHECK_THROWS_WITH(op.forward({fake(4098), fake(1 << 20), 10}), Contains("not aligned"));
  CHECK_THROWS_WITH(op.forward({fake(4096), fake(1 << 20), 10, 0, 0, 0.0f}), Contains("temperature = 0"));
  CHECK_THROWS_WITH(op.forward({fake(4096), fake(1 << 20), 10, 0, 0, NAN}), Contains("temperature"));
  // y overlapping x without being x (shifted by one row).
  CHECK_THROWS_WITH(op.forward({fake(4096), fake(4096 + 64 * 4), 10}), Contains("overlaps"));
  CHECK_THROWS_WITH(op.forward({fake(4096), fake(1 << 20), 10, 0, 0, 1.0f, reinterpret_cast<std::int32_t*>(fake(4098))}),
                    Contains("support"));
}

TEST_CASE("backward arguments are checked", "[args]") {
  RowNorm op(sparsemax_spec(16, DType::bf16));
  CHECK_THROWS_WITH(op.backward({fake(4096), nullptr, fake(1 << 20), 5}), Contains("dy is a null pointer"));
  CHECK_THROWS_WITH(op.backward({fake(4096), fake(8192), fake(1 << 20), 5, 8}), Contains("y has row stride 8"));
  CHECK_THROWS_WITH(op.backward({fake(4097), fake(8192), fake(1 << 20), 5}), Contains("2-byte bf16"));
}

TEST_CASE("an explicit vec needs its alignment", "[args]") {
  RowNorm op(softmax_spec(64), {0, 4, 0, -1});
  CHECK_THROWS_WITH(op.forward({fake(4100), fake(1 << 20), 10}), Contains("not aligned to 16 bytes"));
}

TEST_CASE("without a GPU a launch fails with one clear error", "[args][nogpu]") {
  if (gpu_available()) {
    WARN("a GPU is present: the no-GPU error path cannot be exercised here");
    return;
  }
  RowNorm op(entmax_spec(1.5f, 64));
  try {
    op.forward({fake(4096), fake(1 << 20), 10});
    FAIL("a launch without a GPU did not throw");
  } catch (const NoDevice& e) {
    CHECK_THAT(e.what(), Contains("GPU"));
  }
  CHECK_FALSE(system_info().no_gpu_reason.empty());
}

TEST_CASE("attention_block_mass refuses a bad block size, a sparse spec and a bad GQA group before any GPU work",
          "[args]") {
  AttentionForwardArgs args;
  args.q = fake(4096), args.k = fake(1 << 20);
  args.heads_q = 3, args.heads_kv = 2, args.seq_q = 128, args.seq_k = 128;
  AttentionSpec dense;
  CHECK_THROWS_WITH(attention_block_mass(dense, args, 48), Contains("block_size = 48: use 16, 32, 64 or 128"));
  AttentionSpec sparse = dense;
  sparse.sparsity = Sparsity::block_sparse, sparse.block_size = 64;
  CHECK_THROWS_WITH(attention_block_mass(sparse, args, 64), Contains("is not dense"));
  CHECK_THROWS_WITH(attention_block_mass(dense, args, 64), Contains("heads_q = 3 must be a positive multiple of heads_kv = 2"));
}
