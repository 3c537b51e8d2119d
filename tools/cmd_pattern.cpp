// sjit pattern build KIND ... -o FILE | combine union|intersection FILES -o FILE | show FILE | draw FILE
// -o PNG: pattern files for `sjit bench attention --pattern` and `sjit tune attention --pattern`, their
// statistics and their pictures.
#include <fmt/format.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <span>

#include "commands.h"

namespace sjit::tool {
namespace {

struct BuildOptions {
  std::string kind;
  int block = 128, heads = 1;
  std::int64_t seq = 0, seq_k = 0;
  std::string align = "tl";
  std::int64_t before = 0, after = 0;
  int local = 1, global = 1, random = 2;
  double density = 0.1;
  std::uint64_t seed = 7;
  std::string scores;  // scores: a raw little-endian float32 file, [heads][block_rows][block_cols]
  std::int64_t top_k = 0;
  double mass = 1.0;
  bool no_diagonal = false;
  std::string out;
};

// The options each kind of pattern reads, beyond --block, --seq, --seq-k, --heads and -o.
const std::map<std::string, std::set<std::string>>& kind_options() {
  static const std::map<std::string, std::set<std::string>> kinds = {
      {"dense", {}},
      {"causal", {"--align"}},
      {"window", {"--before", "--after"}},
      {"bigbird", {"--local", "--global", "--random", "--seed"}},
      {"random", {"--density", "--seed"}},
      {"scores", {"--scores", "--top-k", "--mass", "--no-diagonal"}},
  };
  return kinds;
}

// A raw little-endian float32 file (numpy: scores.astype("<f4").tofile(path)).
std::vector<float> read_scores(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("--scores {}: cannot open: {}", path, std::strerror(errno)));
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() % 4 != 0)
    throw InvalidArgument(fmt::format("--scores {}: {} bytes is not a whole number of float32 values", path, bytes.size()));
  std::vector<float> scores(bytes.size() / 4);
  for (std::size_t i = 0; i < scores.size(); ++i) {
    std::uint32_t bits = 0;
    for (int b = 3; b >= 0; --b) bits = bits << 8 | static_cast<unsigned char>(bytes[4 * i + std::size_t(b)]);
    scores[i] = std::bit_cast<float>(bits);
  }
  return scores;
}

BlockPattern build(const BuildOptions& o, CLI::App& cmd) {
  const auto kind = kind_options().find(o.kind);
  if (kind == kind_options().end())
    throw InvalidArgument(fmt::format("pattern kind '{}': use dense, causal, window, bigbird, random or scores", o.kind));
  for (const std::string name : {"--align", "--before", "--after", "--local", "--global", "--random", "--density",
                                 "--seed", "--scores", "--top-k", "--mass", "--no-diagonal"})
    if (cmd.count(name) > 0 && !kind->second.contains(name))
      throw InvalidArgument(fmt::format("{} does not apply to a {} pattern (it takes {})", name, o.kind,
                                        kind->second.empty() ? "none of them" : fmt::format("{}", fmt::join(kind->second, ", "))));
  const std::int64_t seq_k = o.seq_k ? o.seq_k : o.seq;
  if (o.kind == "dense") return patterns::dense(o.block, o.seq, seq_k, o.heads);
  if (o.kind == "causal") {
    if (o.align != "tl" && o.align != "br") throw InvalidArgument(fmt::format("--align {}: use tl or br", o.align));
    return patterns::causal(o.block, o.seq, seq_k, o.align == "tl" ? CausalAlign::top_left : CausalAlign::bottom_right,
                            o.heads);
  }
  if (o.kind == "window") return patterns::sliding_window(o.block, o.seq, seq_k, o.before, o.after, o.heads);
  if (o.kind == "bigbird")
    return patterns::bigbird(o.block, o.seq, seq_k, o.local, o.global, o.random, o.seed, o.heads);
  if (o.kind == "random") return patterns::random(o.block, o.seq, seq_k, o.density, o.seed, o.heads);
  if (o.scores.empty()) throw InvalidArgument("a scores pattern reads its scores from a file: give it with --scores FILE");
  const std::vector<float> scores = read_scores(o.scores);
  return patterns::from_scores(o.block, o.seq, seq_k, scores,
                               {.top_k = o.top_k, .mass = o.mass, .diagonal = !o.no_diagonal}, o.heads);
}

void print_summary(const std::string& name, const BlockPattern& p) {
  const PatternStats s = p.stats();
  fmt::print("{}: blocks of {}, {} x {} blocks, {} head{}{}, digest {:016x}\n", name, p.block_size(), p.block_rows(),
             p.block_cols(), p.heads(), p.heads() == 1 ? " (shared by every attention head)" : "s",
             p.heads() == 1 ? "" : " (one pattern each)", p.digest());
  fmt::print("{} active blocks, density {:.4f}; blocks a row: min {}, mean {:.1f}, max {}; {} empty row{}\n", s.nnz,
             s.density, s.min_per_row, s.mean_per_row, s.max_per_row, s.empty_rows, s.empty_rows == 1 ? "" : "s");
  if (p.heads() == 1) return;
  // Learned patterns differ from head to head: the sparsest and the densest.
  const std::span<const std::int32_t> row_ptr = p.row_ptr();
  auto head_nnz = [&](int h) { return row_ptr[std::size_t((h + 1) * p.block_rows())] - row_ptr[std::size_t(h * p.block_rows())]; };
  int sparsest = 0, densest = 0;
  for (int h = 1; h < p.heads(); ++h) {
    if (head_nnz(h) < head_nnz(sparsest)) sparsest = h;
    if (head_nnz(h) > head_nnz(densest)) densest = h;
  }
  const double tiles = double(p.block_rows()) * double(p.block_cols());
  fmt::print("per head: density {:.4f} (head {}) to {:.4f} (head {})\n", head_nnz(sparsest) / tiles, sparsest,
             head_nnz(densest) / tiles, densest);
}

}  // namespace

Runner add_pattern(CLI::App& app) {
  auto* cmd = app.add_subcommand("pattern", "Build block-sparse pattern files; show their statistics; draw them");
  cmd->require_subcommand(1);

  auto b = std::make_shared<BuildOptions>();
  auto* build_cmd = cmd->add_subcommand("build", "Build a pattern and save it (BlockPattern::save): KIND -o FILE");
  build_cmd->add_option("kind", b->kind, "dense | causal | window | bigbird | random | scores")->required();
  build_cmd->add_option("--block", b->block, "Block size: 16, 32, 64 or 128 (default 128)");
  build_cmd->add_option("--seq", b->seq, "Query length in elements")->required();
  build_cmd->add_option("--seq-k", b->seq_k, "Key length (default: --seq)");
  build_cmd->add_option("--heads", b->heads, "Heads: 1 shares the pattern with every attention head (default 1)");
  build_cmd->add_option("--align", b->align, "causal: tl (top-left) or br (bottom-right)");
  build_cmd->add_option("--before", b->before, "window: key blocks before the diagonal");
  build_cmd->add_option("--after", b->after, "window: key blocks after the diagonal");
  build_cmd->add_option("--local", b->local, "bigbird: blocks each side of the diagonal (default 1)");
  build_cmd->add_option("--global", b->global, "bigbird: global blocks (default 1)");
  build_cmd->add_option("--random", b->random, "bigbird: random blocks a row (default 2)");
  build_cmd->add_option("--density", b->density, "random: share of each row's blocks, the diagonal kept (default 0.1)");
  build_cmd->add_option("--seed", b->seed, "bigbird, random: seed of the draws (default 7)");
  build_cmd->add_option("--scores", b->scores,
                        "scores: a raw little-endian float32 file of a score per tile, [heads][block_rows][block_cols] "
                        "(attention_block_mass's; numpy: a.astype('<f4').tofile(path))");
  build_cmd->add_option("--top-k", b->top_k, "scores: at most this many tiles a row (patterns::from_scores)");
  build_cmd->add_option("--mass", b->mass, "scores: the fewest tiles a row carrying this share of its total (in (0, 1])");
  build_cmd->add_flag("--no-diagonal", b->no_diagonal, "scores: do not keep each row's diagonal tile first");
  build_cmd->add_option("-o,--out", b->out, "The pattern file to write")->required();

  auto show_file = std::make_shared<std::string>();
  auto show_head = std::make_shared<int>(0);
  auto show_cols = std::make_shared<int>(64);
  auto* show = cmd->add_subcommand("show", "Statistics of a pattern file and a text picture of one head");
  show->add_option("file", *show_file, "A pattern file")->required();
  show->add_option("--head", *show_head, "The head to picture (default 0)");
  show->add_option("--cols", *show_cols, "Characters a line the picture may take (default 64)");

  auto how = std::make_shared<std::string>();
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto combined_out = std::make_shared<std::string>();
  auto* combine = cmd->add_subcommand("combine", "The union or intersection of pattern files (patterns::united, intersected)");
  combine->add_option("how", *how, "union (tiles active in any file) | intersection (in every file)")->required();
  combine->add_option("files", *inputs, "Two or more pattern files of one shape")->required()->expected(2, -1);
  combine->add_option("-o,--out", *combined_out, "The pattern file to write")->required();

  auto draw_file = std::make_shared<std::string>();
  auto draw_out = std::make_shared<std::string>();
  auto draw_options = std::make_shared<PictureOptions>();
  auto* draw_cmd = cmd->add_subcommand("draw", "A PNG picture of a pattern file: active blocks black, heads side by side");
  draw_cmd->add_option("file", *draw_file, "A pattern file")->required();
  draw_cmd->add_option("-o,--out", *draw_out, "The PNG file to write")->required();
  draw_cmd->add_option("--head", draw_options->head, "One head only (default: every head)");
  draw_cmd->add_option("--max-side", draw_options->max_side,
                       "Pixels a head's side may take; larger patterns shade cells of several blocks (default 2048)");

  return [=] {
    if (build_cmd->parsed()) {
      const BlockPattern p = build(*b, *build_cmd);
      p.save(b->out);
      print_summary(fmt::format("wrote {}", b->out), p);
    } else if (show->parsed()) {
      const BlockPattern p = BlockPattern::load(*show_file);
      print_summary(*show_file, p);
      const std::string picture = draw_text(p, *show_head, *show_cols);
      const std::int64_t cell = (std::max(p.block_rows(), p.block_cols()) + *show_cols - 1) / *show_cols;
      fmt::print("head {} ('#' every block of a cell active, '+' some, '.' none; a cell is {} x {} block{}):\n{}",
                 *show_head, cell, cell, cell == 1 ? "" : "s", picture);
    } else if (combine->parsed()) {
      if (*how != "union" && *how != "intersection")
        throw InvalidArgument(fmt::format("sjit pattern combine {}: use union or intersection", *how));
      BlockPattern p = BlockPattern::load(inputs->front());
      for (std::size_t i = 1; i < inputs->size(); ++i) {
        const BlockPattern next = BlockPattern::load((*inputs)[i]);
        p = *how == "union" ? patterns::united(p, next) : patterns::intersected(p, next);
      }
      p.save(*combined_out);
      print_summary(fmt::format("wrote {}", *combined_out), p);
    } else if (draw_cmd->parsed()) {
      const BlockPattern p = BlockPattern::load(*draw_file);
      const PatternPicture picture = draw(p, *draw_options);
      save_png(picture, *draw_out);
      fmt::print("wrote {}: {} x {} pixels, {} pixel{} a cell of {} x {} block{}\n", *draw_out, picture.width,
                 picture.height, picture.pixels_per_cell, picture.pixels_per_cell == 1 ? "" : "s",
                 picture.blocks_per_cell, picture.blocks_per_cell, picture.blocks_per_cell == 1 ? "" : "s");
    }
    return 0;
  };
}

}  // namespace sjit::tool
