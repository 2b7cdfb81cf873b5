// softmax_row.h's ExpNonPositive over a SIMD register of any width: the same IEEE operations
// per element, so every lane gets the scalar function's bits. `Ops` names the register type
// and its operations (softmax_avx2.cc and softmax_avx512.cc each define theirs); include only
// from files compiled for that ISA. Internal linkage, as in softmax_row.h.
#pragma once

namespace glmserve::internal {
namespace {

// Ops: V (the register type), Set(float), Add, Sub, Mul, Max(a, b) (a > b ? a : b for
// non-NaN), TwoToTheN(n) (2^n from integral n, as its float's bits), ZeroBelow(e, x, limit)
// (0 where x < limit, else e).
template <class Ops>
inline typename Ops::V ExpNonPositiveSimd(typename Ops::V x) {
  using V = typename Ops::V;
  const V xc = Ops::Max(x, Ops::Set(-87.0f));  // x > -87 ? x : -87
  const V magic = Ops::Set(12582912.0f);
  const V n = Ops::Sub(Ops::Add(Ops::Mul(xc, Ops::Set(1.44269504088896341f)), magic), magic);
  V r = Ops::Sub(xc, Ops::Mul(n, Ops::Set(0.693359375f)));
  r = Ops::Sub(r, Ops::Mul(n, Ops::Set(-2.12194440e-4f)));
  V p = Ops::Set(1.9875691500e-4f);
  p = Ops::Add(Ops::Mul(p, r), Ops::Set(1.3981999507e-3f));
  p = Ops::Add(Ops::Mul(p, r), Ops::Set(8.3334519073e-3f));
  p = Ops::Add(Ops::Mul(p, r), Ops::Set(4.1665795894e-2f));
  p = Ops::Add(Ops::Mul(p, r), Ops::Set(1.6666665459e-1f));
  p = Ops::Add(Ops::Mul(p, r), Ops::Set(5.0000001201e-1f));
  const V y = Ops::Add(Ops::Add(Ops::Mul(p, Ops::Mul(r, r)), r), Ops::Set(1.0f));
  return Ops::ZeroBelow(Ops::Mul(y, Ops::TwoToTheN(n)), x, -87.0f);
}

}  // namespace
}  // namespace glmserve::internal
