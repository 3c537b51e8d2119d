"""What the instrumenting scripts share: text patches that say what they no longer find, and the C++ a
kernel launch needs to fill and dump a timeline buffer (WORDS 64-bit words a CTA, zeroed before the
launch, written to $ENV.KIND after it: the call synchronizes, so only the stamps inside the kernel are
timings)."""
import sys


def patch(path, pairs):
    """Replaces each (old, new) once in the file at path; stops, naming the text, where old is missing."""
    s = open(path).read()
    for old, new in pairs:
        if old not in s:
            sys.exit(f'{sys.argv[0]}: {path} no longer has the text:\n{old}')
        s = s.replace(old, new, 1)
    open(path, 'w').write(s)


def host_setup(env, grid, words, condition='true'):
    """Before the launch: the buffer, zeroed, in p.timeline when $env is set (and condition holds)."""
    return f"""  static DeviceBuffer timeline;
  const char* timeline_path = std::getenv("{env}");
  if (timeline_path && ({condition})) {{
    if (timeline.bytes() < std::size_t({grid}) * {8 * words}) timeline = DeviceBuffer(std::size_t({grid}) * {8 * words});
    timeline.fill_bytes(0, stream);
    p.timeline = timeline.as<unsigned long long>();
  }}
"""


def host_dump(grid, words, kind):
    """After the launch: waits for it and writes the buffer to $ENV.<kind> (a C++ expression)."""
    return f"""  if (p.timeline) {{
    synchronize(stream);
    std::vector<unsigned long long> host(std::size_t({grid}) * {words});
    timeline.download(host.data(), host.size() * 8);
    const std::string path = fmt::format("{{}}.{{}}", timeline_path, {kind});
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {{
      std::fwrite(host.data(), 8, host.size(), f);
      std::fclose(f);
    }}
  }}
"""


HOST_INCLUDES = ("#include <cstring>\n", "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n")


def device_stamps(macro, words):
    """A nanosecond clock and MACRO(slot, value), which stores into the CTA's words when p.timeline is set."""
    return f"""__device__ __forceinline__ unsigned long long timeline_now() {{
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}}
#define {macro}(slot, value) \\
  do {{ if (p.timeline && (slot) < {words}) p.timeline[blockIdx.x * {words}ull + (slot)] = (value); }} while (0)

"""


def patch_forward_launch(root, env, words):
    """A timeline buffer for the forward: p.timeline in its parameters, filled and dumped around its launch
    (to $env.dense or $env.sparse)."""
    patch(root + '/templates/sparsejit/attention_params.cuh', [("""  unsigned* tail_counters;   // [tail_items][warps], zero on entry and left zero
};""", """  unsigned* tail_counters;   // [tail_items][warps], zero on entry and left zero
  unsigned long long* timeline;
};""")])
    patch(root + '/src/attention/attention.cpp', [
        ("""  void* params[] = {&p, &maps};
  jit::launch(kernel, unsigned(grid), unsigned(forward_threads(config)), reinterpret_cast<CUstream>(stream), params);
}""", host_setup(env, 'grid', words) + """  void* params[] = {&p, &maps};
  jit::launch(kernel, unsigned(grid), unsigned(forward_threads(config)), reinterpret_cast<CUstream>(stream), params);
""" + host_dump('grid', words, 'spec.sparsity == Sparsity::dense ? "dense" : "sparse"') + "}"),
        HOST_INCLUDES])
