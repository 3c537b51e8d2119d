// Launch layouts for the row normalizers: the heuristic default and the checks on a chosen one.
#include <fmt/format.h>

#include <bit>

#include "codegen/kernel_source.h"
#include "sparsejit/error.h"
#include "sparsejit/rownorm.h"
#include "spec/key_text.h"

namespace sjit {
namespace {

// Rows longer than this keep their elements in shared memory rather than registers.
constexpr int kLongestRowInRegisters = 8192;
// Most fp32 values one thread keeps per slice: beyond this the register file spills.
constexpr int kMaxElementsPerThread = 64;
// Block size for teams within a warp. In `sjit tune` sweeps on the H100, 128 threads won or tied
// everywhere (general alpha at n = 1024: 88 us against 100 us with 256), but with 32 elements a
// thread ptxas then caps registers for occupancy and spills; 512 threads times the same (88.5 us)
// and spills nothing.
constexpr int kBlockForWarpTeams = 128;
constexpr int kBlockForLongWarpRows = 512;
int block_for_warp_team(int elements_per_thread) {
  return elements_per_thread >= 32 ? kBlockForLongWarpRows : kBlockForWarpTeams;
}

int slices(const RowNormSpec& spec) { return spec.pass == Pass::forward ? 1 : 2; }  // backward holds y and dy

}  // namespace

std::string key(const RowNormConfig& c) {
  return fmt::format("tpr={},vec={},block={},smem={}{}", c.threads_per_row, c.vec, c.block_threads, c.row_in_smem,
                     c.wrong_result_for_tests ? ",wrong=1" : "");
}

RowNormConfig parse_rownorm_config(std::string_view text) {
  spec::KeyText kt = spec::split_key(fmt::format("config:{}", text));
  RowNormConfig c;
  c.threads_per_row = spec::parse_int("tpr", spec::take_or(kt, "tpr", "0"));
  c.vec = spec::parse_int("vec", spec::take_or(kt, "vec", "0"));
  c.block_threads = spec::parse_int("block", spec::take_or(kt, "block", "0"));
  c.row_in_smem = spec::parse_int("smem", spec::take_or(kt, "smem", "-1"));
  c.wrong_result_for_tests = spec::parse_int("wrong", spec::take_or(kt, "wrong", "0")) != 0;
  spec::reject_leftovers(kt, "tpr, vec, block, smem, wrong (tests only)");
  return c;
}

RowNormConfig default_config(const RowNormSpec& spec, int max_vec) {
  RowNormConfig c;
  const int elem = int(size_of(spec.dtype));
  // Widest access (16 bytes at most) that divides the row and that the pointers allow.
  c.vec = 1;
  while (c.vec * 2 * elem <= 16 && c.vec * 2 <= max_vec && spec.n % (c.vec * 2) == 0) c.vec *= 2;
  if (spec.n > kLongestRowInRegisters) {
    // 256 threads: at 1024 (64-register cap) the forward spills, at 512 the general-alpha backward.
    c.threads_per_row = 256;
    c.block_threads = 256;
    c.row_in_smem = 1;
    return c;
  }
  // Short rows: two packets a thread, so each thread has two loads in flight and a team stays small
  // (a thread per row at n = 8 fp32: no shuffles at all); entmax's threshold search does several
  // reductions, so there 16 elements a thread pay for fewer shuffle levels (measured on an H100:
  // n = 64 fp32 at 99% of copy bandwidth with 4 threads a row, 87% with 8). Long rows: up to 32
  // elements a thread in the forward (16 in the backward, which holds two slices).
  const bool searches = spec.kind == NormKind::entmax && spec.pass == Pass::forward;
  const int short_row = searches ? std::max(16, 2 * c.vec) : 2 * c.vec;
  const int per_thread = spec.n <= 256 ? short_row : (spec.pass == Pass::forward ? 32 : 16);
  const int wanted = (spec.n + per_thread - 1) / per_thread;
  c.threads_per_row = std::min(1024, int(std::bit_ceil(unsigned(wanted))));
  const int elements_per_thread = (spec.n + c.threads_per_row - 1) / c.threads_per_row;
  c.block_threads = c.threads_per_row > 32 ? c.threads_per_row : block_for_warp_team(elements_per_thread);
  c.row_in_smem = 0;
  return c;
}

RowNormConfig resolve(const RowNormSpec& spec, RowNormConfig c) {
  const RowNormConfig d = default_config(spec, c.vec > 0 ? c.vec : 16);
  if (c.vec == 0) c.vec = d.vec;
  if (c.threads_per_row == 0) c.threads_per_row = d.threads_per_row;
  if (c.block_threads == 0)
    c.block_threads = c.threads_per_row > 32 ? c.threads_per_row
                                             : block_for_warp_team((spec.n + c.threads_per_row - 1) / c.threads_per_row);
  if (c.row_in_smem < 0) c.row_in_smem = d.row_in_smem;

  auto bad = [&](const std::string& what) {
    return InvalidArgument(fmt::format("rownorm config {} for {}: {}", key(c), key(spec), what));
  };
  const int elem = int(size_of(spec.dtype));
  if (c.vec < 1 || !std::has_single_bit(unsigned(c.vec)) || c.vec * elem > 16)
    throw bad(fmt::format("vec = {} must be a power of two with vec x {} bytes <= 16", c.vec, elem));
  if (spec.n % c.vec != 0) throw bad(fmt::format("vec = {} does not divide n = {}", c.vec, spec.n));
  if (c.threads_per_row < 1 || c.threads_per_row > 1024 || !std::has_single_bit(unsigned(c.threads_per_row)))
    throw bad(fmt::format("tpr = {} must be a power of two from 1 to 1024", c.threads_per_row));
  if (c.block_threads < 32 || c.block_threads > 1024 || c.block_threads % 32 != 0)
    throw bad(fmt::format("block = {} must be a multiple of 32 from 32 to 1024", c.block_threads));
  if (c.threads_per_row > 32 && c.block_threads != c.threads_per_row)
    throw bad("a team wider than a warp (tpr > 32) needs block = tpr");
  if (c.block_threads % c.threads_per_row != 0) throw bad("block must be a multiple of tpr");
  if (c.row_in_smem != 0 && c.row_in_smem != 1) throw bad("smem must be 0 or 1");
  if (c.row_in_smem == 1) {
    if (c.threads_per_row != c.block_threads) throw bad("a row in shared memory needs block = tpr");
    if (spec.n * 4 * slices(spec) > codegen::kMaxDynamicSharedBytes) throw bad("the row does not fit in shared memory");
  } else {
    const int packets_per_thread = (spec.n / c.vec + c.threads_per_row - 1) / c.threads_per_row;
    if (packets_per_thread * c.vec > kMaxElementsPerThread)
      throw bad(fmt::format("{} elements per thread would spill registers (at most {}): use more threads per row "
                            "or smem=1", packets_per_thread * c.vec, kMaxElementsPerThread));
  }
  return c;
}

}  // namespace sjit
