/* A product of a few rows by a large weight, y = x W^T + b, for a decoding step of a few sentences (up to 8 rows).

   Such a step reads every weight once from memory and does little arithmetic on it, so what counts is how fast
   the weight streams: each thread takes one contiguous range of W's rows (the outputs), reads each row once and
   dots it with every row of x, which stays in the L1 cache. On an AMD EPYC (Zen 4) this streamed an
   OPUS-MT-base step's 207 MB at about 27 GB/s where oneDNN's prepacked product made 20 (benchmarks/RESULTS.md,
   issue 64); the chooser in matmul.py times it against the libraries for each shape and row count and uses it
   only where it wins.

   Built by matmul.py on the machine that runs it (-O3 -march=native: AVX-512 where the CPU has it, AVX2 or NEON
   elsewhere), with the OpenMP runtime PyTorch itself loaded, so its threads are PyTorch's.

   Shapes: x (M, K), W (N, K), b (N) or NULL, y (M, N), all contiguous; all float32 (rows_linear_f32) or all bf16
   (rows_linear_bf16: half the bytes to stream; each value widened to float32 exactly and summed in float32, and
   y rounded to the nearest bf16, as oneDNN's bf16 product does). */

#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 16
typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef int lanes __attribute__((vector_size(LANES * sizeof(int))));
typedef unsigned short halves __attribute__((vector_size(LANES * sizeof(unsigned short))));
typedef unsigned int words __attribute__((vector_size(LANES * sizeof(unsigned int))));

#ifdef __clang__
#define SHUFFLE(a, ...) __builtin_shufflevector(a, a, __VA_ARGS__)
#else
#define SHUFFLE(a, ...) __builtin_shuffle(a, (lanes){__VA_ARGS__})
#endif

static inline float sum_lanes(vec a) {  /* a tree: the rows' sums are independent, so they overlap */
  a += SHUFFLE(a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  a += SHUFFLE(a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  a += SHUFFLE(a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  a += SHUFFLE(a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return a[0];
}

/* W's values i .. i + LANES, as float32 (a bf16 value is the top half of its float32) */
static inline __attribute__((always_inline)) vec load(const void *w, long i, const int bf16) {
  vec v;
  if (bf16) {
    halves h;
    memcpy(&h, (const unsigned short *)w + i, sizeof h);
    words u = __builtin_convertvector(h, words) << 16;
    memcpy(&v, &u, sizeof v);
  } else {
    memcpy(&v, (const float *)w + i, sizeof v);
  }
  return v;
}

static inline __attribute__((always_inline)) float value(const void *w, long i, const int bf16) {
  if (!bf16) return ((const float *)w)[i];
  unsigned int u = (unsigned int)((const unsigned short *)w)[i] << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline __attribute__((always_inline)) void store(void *y, long i, float f, const int bf16) {
  if (!bf16) {
    ((float *)y)[i] = f;
    return;
  }
  unsigned int u;
  memcpy(&u, &f, sizeof u);
  u = (u & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : u + 0x7fffu + ((u >> 16) & 1u);  /* NaN; else to nearest even */
  ((unsigned short *)y)[i] = (unsigned short)(u >> 16);
}

/* Outputs [n0, n1) of M rows (x widened to float32 already); M and bf16 constants where inlined, so the rows'
   accumulators stay in registers. */
static inline __attribute__((always_inline)) void outputs(const float *x, const void *w, const void *b, void *y,
                                                          const int M, long K, long N, long n0, long n1,
                                                          const int bf16) {
  const long full = K - K % LANES;
  for (long n = n0; n < n1; n++) {
    vec acc[8];
    for (int m = 0; m < M; m++) acc[m] = (vec){0};
    for (long k = 0; k < full; k += LANES) {
      vec xv, wv = load(w, n * K + k, bf16);
      for (int m = 0; m < M; m++) {
        memcpy(&xv, x + m * K + k, sizeof xv);
        acc[m] += xv * wv;
      }
    }
    for (int m = 0; m < M; m++) {
      float s = sum_lanes(acc[m]);
      for (long k = full; k < K; k++) s += x[m * K + k] * value(w, n * K + k, bf16);
      store(y, m * N + n, s + (b ? value(b, n, bf16) : 0.f), bf16);
    }
  }
}

/* Any M: more than 8 rows go 8 at a time (each thread reading its range of W once per 8). */
static inline __attribute__((always_inline)) void rows_linear(const float *x, const void *w, const void *b, void *y,
                                                              long M, long K, long N, int threads, const int bf16) {
#pragma omp parallel num_threads(threads)
  {
#ifdef _OPENMP
    const long t = omp_get_thread_num(), T = omp_get_num_threads();
#else
    const long t = 0, T = 1;
#endif
    const long n0 = N * t / T, n1 = N * (t + 1) / T;
    for (long m0 = 0; m0 < M; m0 += 8) {
      const float *xm = x + m0 * K;
      void *ym = bf16 ? (void *)((unsigned short *)y + m0 * N) : (void *)((float *)y + m0 * N);
      switch (M - m0) {
        case 1: outputs(xm, w, b, ym, 1, K, N, n0, n1, bf16); break;
        case 2: outputs(xm, w, b, ym, 2, K, N, n0, n1, bf16); break;
        case 3: outputs(xm, w, b, ym, 3, K, N, n0, n1, bf16); break;
        case 4: outputs(xm, w, b, ym, 4, K, N, n0, n1, bf16); break;
        case 5: outputs(xm, w, b, ym, 5, K, N, n0, n1, bf16); break;
        case 6: outputs(xm, w, b, ym, 6, K, N, n0, n1, bf16); break;
        case 7: outputs(xm, w, b, ym, 7, K, N, n0, n1, bf16); break;
        default: outputs(xm, w, b, ym, 8, K, N, n0, n1, bf16); break;
      }
    }
  }
}

void rows_linear_f32(const float *x, const float *w, const float *b, float *y, long M, long K, long N, int threads) {
  rows_linear(x, w, b, y, M, K, N, threads, 0);
}

/* Returns 0, or -1 where there was no memory for x widened (nothing written). */
int rows_linear_bf16(const unsigned short *x, const unsigned short *w, const unsigned short *b, unsigned short *y,
                     long M, long K, long N, int threads) {
  float *wide = malloc(M * K * sizeof *wide + 1);
  if (!wide) return -1;
  for (long i = 0; i < M * K; i++) wide[i] = value(x, i, 1);
  rows_linear(wide, w, b, y, M, K, N, threads, 1);
  free(wide);
  return 0;
}
