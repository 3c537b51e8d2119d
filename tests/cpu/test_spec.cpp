// Spec key texts: canonical, round-tripping, and refusing what is wrong with a message naming it.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <typeinfo>
#include <vector>

#include "sparsejit/sparsejit.h"
#include "support/test_support.h"

using namespace sjit;

TEST_CASE("key text round-trips through parse", "[spec]") {
  std::mt19937_64 rng(test::fresh_seed());
  std::uniform_int_distribution<int> n_dist(1, RowNormSpec::kMaxN);
  std::uniform_real_distribution<float> alpha_dist(1.0f, 16.0f);
  for (int i = 0; i < 500; ++i) {
    RowNormSpec s{NormKind(i % 3), alpha_dist(rng), n_dist(rng), DType(i % 5 % 3), Pass((i / 3) % 2)};
    s = canonical(s);
    CAPTURE(key(s));
    CHECK(parse_rownorm(key(s)) == s);
  }
}

TEST_CASE("key text has the documented form", "[spec]") {
  CHECK(key(entmax_spec(1.5f, 64, DType::bf16)) == "rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16,pass=fwd");
  CHECK(key(softmax_spec(8, DType::f32, Pass::backward)) == "rownorm:kind=softmax,n=8,dtype=f32,pass=bwd");
  // Fields in any order, defaults for dtype and pass.
  CHECK(parse_rownorm("rownorm:n=64,kind=sparsemax") == sparsemax_spec(64));
}

TEST_CASE("alpha 1 is softmax and alpha 2 is sparsemax: one spec per function", "[spec]") {
  CHECK(entmax_spec(1.0f, 10) == softmax_spec(10));
  CHECK(entmax_spec(2.0f, 10) == sparsemax_spec(10));
  CHECK(parse_rownorm("rownorm:kind=entmax,alpha=2,n=10") == sparsemax_spec(10));
}

TEST_CASE("bad key texts are refused with a message naming the problem", "[spec]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=entmax,n=8"), Contains("alpha"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmax,n=0"), Contains("n = 0"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmax,n=99999"), Contains("n = 99999"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmin,n=8"), Contains("softmin"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmax,n=8,dtype=f64"), Contains("f64"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmax,n=8,colour=red"), Contains("colour"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmax,n=8,n=9"), Contains("twice"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=softmax,n=eight"), Contains("eight"));
  CHECK_THROWS_WITH(parse_rownorm("rownorm:kind=entmax,alpha=0.5,n=8"), Contains("alpha = 0.5"));
  CHECK_THROWS_WITH(parse_rownorm("attention:kind=softmax,n=8"), Contains("not a rownorm"));
  CHECK_THROWS_WITH(parse_rownorm("kind=softmax"), Contains("op name"));
  CHECK_THROWS_AS(parse_rownorm("rownorm:kind=softmax,n=8,"), InvalidSpec);
}

TEST_CASE("configs: defaults are valid, bad ones are refused", "[spec][config]") {
  for (DType d : {DType::f32, DType::f16, DType::bf16})
    for (int n : {1, 2, 7, 8, 16, 33, 64, 100, 1000, 1024, 4096, 8192, 8193, 16384})
      for (Pass p : {Pass::forward, Pass::backward}) {
        const RowNormSpec s = softmax_spec(n, d, p);
        CAPTURE(key(s));
        const RowNormConfig c = resolve(s, {});
        CHECK(n % c.vec == 0);
        CHECK(parse_rownorm_config(key(c)) == c);
      }
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(resolve(softmax_spec(8), {3, 0, 0, -1}), Contains("tpr = 3"));
  CHECK_THROWS_WITH(resolve(softmax_spec(12), {0, 8, 0, -1}), Contains("vec = 8"));
  CHECK_THROWS_WITH(resolve(softmax_spec(8192), {1, 1, 32, 0}), Contains("spill"));
  CHECK_THROWS_WITH(resolve(softmax_spec(64), {64, 0, 256, 0}), Contains("block = tpr"));
  CHECK_THROWS_WITH(parse_rownorm_config("tpr=4,colour=2"), Contains("colour"));
}

// Key texts a few edits away from valid ones (characters and tokens such as huge or negative numbers,
// nan, empty fields inserted, replaced or removed): each parses, and then its canonical key parses to
// itself, or is refused with InvalidArgument. Anything else (std::out_of_range from a number, a crash
// under the sanitizers) fails.
TEST_CASE("mutated key texts parse to canonical keys or are refused with InvalidArgument", "[spec]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const std::string alphabet = "=,|:-.0123456789abcdefxyzABE+_ ";
  const std::vector<std::string> tokens = {"99999999999999999999", "-1", "0", "nan", "inf", "1e40", "0x10", "=",
                                           ",", "d=", "alpha=", "block=0", "n=2147483648", "  "};
  auto mutate = [&](std::string s) {
    for (int edits = 1 + int(rng() % 4); edits > 0; --edits) {
      const std::size_t at = rng() % (s.size() + 1);
      switch (rng() % 4) {
        case 0: if (at < s.size()) s.erase(at, 1 + rng() % 3); break;
        case 1: s.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        case 2: if (at < s.size()) s[at] = alphabet[rng() % alphabet.size()]; break;
        default: s.insert(at, tokens[rng() % tokens.size()]);
      }
    }
    return s;
  };
  auto check_family = [&](const std::vector<std::string>& valid, auto canonical_key) {
    for (const std::string& text : valid) CHECK_NOTHROW(canonical_key(text));  // the starting points are valid
    int parsed = 0;
    for (int i = 0; i < 3000; ++i) {
      const std::string text = mutate(valid[rng() % valid.size()]);
      CAPTURE(text);
      try {
        const std::string canonical = canonical_key(text);
        CHECK(canonical_key(canonical) == canonical);
        ++parsed;
      } catch (const InvalidArgument&) {
      } catch (const std::exception& e) {
        FAIL("refused with " << typeid(e).name() << " instead of InvalidArgument: " << e.what());
      }
    }
    CHECK(parsed > 0);  // some mutations stay valid (a digit changed, a field reordered), so both paths run
  };
  check_family({"attention:d=128,dtype=bf16", "attention:d=64,dtype=f16,causal=br,sparsity=bsr,block=16",
                "attention:d=128,dtype=bf16,sparsity=bsr,block=64,pass=bwd,det=1"},
               [](const std::string& t) { return key(parse_attention(t)); });
  check_family({"rownorm:kind=softmax,n=8", "rownorm:kind=entmax,alpha=1.5,n=64,dtype=bf16,pass=bwd"},
               [](const std::string& t) { return key(parse_rownorm(t)); });
  check_family({"e23:kind=softmax,n_slots=8,dim=64,dtype=f32", "e23:kind=entmax,alpha=1.5,n_slots=33,dim=520,dtype=f16"},
               [](const std::string& t) { return key(parse_e23(t)); });
  check_family({"tpr=8,vec=4,block=256,smem=0"}, [](const std::string& t) { return key(parse_rownorm_config(t)); });
  check_family({"warps=4,mt=1,bn=32,stages=2,qreg=1,path=mma", "warps=8,mt=2,bn=64,stages=2,qreg=1,path=wgmma_ws"},
               [](const std::string& t) { return key(parse_attention_config(t)); });
}
