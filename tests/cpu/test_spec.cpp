// Spec key texts: canonical, round-tripping, and refusing what is wrong with a message naming it.
#include <catch2/catch.hpp>

#include <random>

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
