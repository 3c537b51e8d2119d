// sjit compile SPEC: generate and compile one kernel, print its resources or emit source/PTX/CUBIN.
#include <fmt/format.h>

#include <fstream>

#include "commands.h"

namespace sjit::tool {
namespace {

void print_list() {
  fmt::print("op rownorm: row normalizers over [rows, n]\n");
  fmt::print("  key text  rownorm:kind=KIND[,alpha=A],n=N[,dtype=DTYPE][,pass=PASS]\n");
  fmt::print("  kind      softmax | sparsemax | entmax (entmax needs alpha)\n");
  fmt::print("  alpha     1 <= alpha <= 16 (1 is softmax, 2 is sparsemax; 1.5 is solved in closed form)\n");
  fmt::print("  n         1 .. {} (registers up to 8192, shared memory above)\n", RowNormSpec::kMaxN);
  fmt::print("  dtype     f32 | f16 | bf16 (default f32; arithmetic is fp32)\n");
  fmt::print("  pass      fwd | bwd (default fwd)\n");
  fmt::print("  config    --config tpr=T,vec=V,block=B,smem=0|1 (any subset; the rest is chosen)\n");
  fmt::print("  example   sjit compile rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16 --arch sm_90a\n");
  fmt::print("\nop attention: fused softmax attention, dense or block-sparse (docs/attention.md)\n");
  fmt::print("  key text  attention:d=D[,dtype=DTYPE][,causal=C][,sparsity=S,block=B][,pass=P][,det=1]\n");
  fmt::print("  d         32 | 64 | 96 | 128 | 256 (head dim)\n");
  fmt::print("  dtype     bf16 | f16 (default bf16; fp32 accumulation)\n");
  fmt::print("  causal    none | tl (top-left) | br (bottom-right)\n");
  fmt::print("  sparsity  dense | bsr (pattern at launch) | baked (needs the pattern: C++ API only)\n");
  fmt::print("  block     16 | 32 | 64 | 128 (pattern block size, bsr and baked)\n");
  fmt::print("  pass      fwd | bwd (bwd keys name a part: '...,pass=bwd|part=prep|dkdv|dq|dq_convert,warps=8,cols=64,\n"
             "            stages=2[,path=wgmma]'; blocks of 16 and 32 also 'part=dkdv|dq,warps=4,cols=64,stages=2,\n"
             "            path=wgmma_gather,block=B')\n");
  fmt::print("  det       1: deterministic backward (a dQ pass of its own); default: dQ summed atomically\n"
             "            or by a pass, whichever is faster for the call\n");
  fmt::print("  config    --config warps=4|8,mt=1|2|4,bn=16|32|64|128,stages=2|3,qreg=0|1[,path=mma|wgmma|wgmma_ws|wgmma_gather]\n");
  fmt::print("            (path=wgmma, wgmma_ws, wgmma_gather: Hopper, --arch sm_90a; wgmma_ws: mt=1, bn 64|128, qreg=0,\n"
             "            stages=4; wgmma_gather: blocks of 16 and 32, warps=4, bn = the block, mt heads a CTA)\n");
  fmt::print("  example   sjit compile attention:d=128,dtype=bf16,causal=tl,sparsity=bsr,block=128\n");
  fmt::print("            sjit compile 'attention:d=128,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma' --arch sm_90a\n");
  fmt::print("\nop e23: the E23 dual-memory Elman cell, a whole sequence a launch (docs/e23.md)\n");
  fmt::print("  key text  e23:kind=KIND[,alpha=A],n_slots=N,dim=D[,dtype=DTYPE][,scale=S][|pass=fwd|bwd]\n");
  fmt::print("  kind      softmax | sparsemax | entmax (entmax needs alpha, 1 <= alpha <= 16)\n");
  fmt::print("  n_slots   1 .. 256 (tape slots)\n");
  fmt::print("  dim       multiple of 8, 8 .. 4096\n");
  fmt::print("  dtype     f32 | bf16 | f16\n");
  fmt::print("  example   sjit compile 'e23:kind=entmax,alpha=1.5,n_slots=8,dim=512,dtype=bf16|pass=bwd' --arch sm_90a\n");
}

}  // namespace

Runner add_compile(CLI::App& app) {
  auto* cmd = app.add_subcommand("compile", "Generate and compile one kernel (no GPU needed)");
  auto spec_text = std::make_shared<std::string>();
  auto arch = std::make_shared<std::string>();
  auto emit = std::make_shared<std::string>("report");
  auto output = std::make_shared<std::string>();
  auto config_text = std::make_shared<std::string>();
  auto list = std::make_shared<bool>(false);
  cmd->add_option("spec", *spec_text, "Key text, e.g. rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16");
  cmd->add_option("--arch", *arch, "Target, e.g. sm_90a or sm_80 (default: the GPU's, or sm_90a without one)");
  cmd->add_option("--emit", *emit, "report | source | ptx | cubin")->check(CLI::IsMember({"report", "source", "ptx", "cubin"}));
  cmd->add_option("-o,--output", *output, "Write the emitted text or binary here instead of standard output");
  cmd->add_option("--config", *config_text, "Layout, e.g. tpr=8,vec=4");
  cmd->add_flag("--list", *list, "List every op, its spec fields and their allowed values");
  return [=] {
    if (*list) {
      print_list();
      return 0;
    }
    if (spec_text->empty()) throw InvalidArgument("compile needs a spec (see sjit compile --list)");
    const std::string kernel_key = config_text->empty() ? *spec_text : *spec_text + "|" + *config_text;
    const std::string target = !arch->empty() ? *arch : gpu_available() ? current_device().arch : "sm_90a";
    std::string payload;
    if (*emit == "source") {
      payload = source_for_key(kernel_key);
    } else {
      const CompiledKernel k = compile_key(kernel_key, target, *emit == "ptx" ? Emit::ptx : Emit::cubin);
      if (*emit == "report") {
        const ResourceUsage& u = k.usage;
        fmt::print("kernel          {}\n", k.kernel_key);
        fmt::print("arch            {}\n", k.arch);
        fmt::print("entry           {}\n", k.lowered_name);
        fmt::print("compile         {:.0f} ms\n", k.compile_ms);
        fmt::print("cubin           {} bytes\n", k.binary.size());
        fmt::print("registers       {}\n", u.registers);
        fmt::print("spills          {} bytes stored, {} bytes loaded\n", u.spill_store_bytes, u.spill_load_bytes);
        fmt::print("stack frame     {} bytes\n", u.stack_frame_bytes);
        fmt::print("shared memory   {} bytes static\n", u.shared_bytes);
        return 0;
      }
      payload = k.binary;
    }
    if (output->empty()) {
      fmt::print("{}", payload);
    } else {
      std::ofstream out(*output, std::ios::binary);
      out.write(payload.data(), std::streamsize(payload.size()));
      if (!out) throw Error(fmt::format("could not write {}", *output));
      fmt::print("wrote {} bytes to {}\n", payload.size(), *output);
    }
    return 0;
  };
}

}  // namespace sjit::tool
