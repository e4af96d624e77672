// The element-wise update loops of the server-side optimizers (embedding/optimizer.h), for
// one row or tensor of n weights. Plain loops in their own file, built with -O3 and
// compiled twice (target_clones): once for the build's baseline ISA and once for AVX2
// (x86-64-v3), picked at load time by the CPU, so the Docker image stays portable while a
// pod on an AVX2 machine updates 8 floats per instruction. Floating-point contraction is
// off in that file, so both versions round every operation alike: results are bitwise the
// same on any x86-64 machine, which keeps a replayed log equal to the original updates.
//
// Every value an update stores (weights and slots) saturates at ±kMaxValue
// (embedding/spec.h): sat(x) = sign(x) * min(|x|, kMaxValue), a NaN becoming ±kMaxValue
// by its sign bit; an accumulator of squares (Adagrad's, Adam's v, FTRL's n), which an
// update leaves >= +0, sat_acc(x) = min(x, kMaxValue), anything negative or NaN becoming
// kMaxValue, so it stays >= 0. No update ever stores a non-finite value. Within spec.h's ranges
// nothing reaches the bound in the first place (see there); saturation is the guarantee for state
// and specs made before those ranges existed.
#pragma once

#include <cstddef>

namespace ps::kernels {

// w = sat(w - lr * g)
void Sgd(float* w, const float* g, size_t n, float lr);
// v = sat(mu * v + g); w = sat(w - lr * (g + mu * v)) if nesterov, else sat(w - lr * v)
void Momentum(float* w, float* v, const float* g, size_t n, float lr, float mu, bool nesterov);
// a = acc + g * g; w = sat(w - lr * g / (sqrt(a) + eps)); acc = sat_acc(a)
void Adagrad(float* w, float* acc, const float* g, size_t n, float lr, float eps);
// m = sat(b1 m + (1 - b1) g); v = sat_acc(b2 v + (1 - b2) g^2);
// w = sat(w - lr (m / c1) / (sqrt(v / c2) + eps)), with the bias corrections
// c1 = 1 - b1^t and c2 = 1 - b2^t computed by the caller.
void Adam(float* w, float* m, float* v, const float* g, size_t n, float lr, float b1, float b2,
          float c1, float c2, float eps);
// FTRL-Proximal (McMahan et al. 2013) with z and the accumulated squared gradients n, each
// stored saturated.
void Ftrl(float* w, float* z, float* acc, const float* g, size_t n, float alpha, float beta,
          float l1, float l2);

// Gradient clipping (TableSpec.clip_value / clip_norm). The sum of squares of g clipped
// to [-clip, clip], in double (no overflow for any finite g), in a fixed order.
double ClippedSquaredNorm(const float* g, size_t n, float clip);
// out = min(max(g, -clip), clip) * scale.
void ClipAndScale(float* out, const float* g, size_t n, float clip, float scale);

}  // namespace ps::kernels
