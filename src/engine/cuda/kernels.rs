//! The elementwise and reduction kernels, as CUDA C compiled by NVRTC at start-up (no nvcc at
//! build time), and the helper that compiles them.
//!
//! Each kernel mirrors a CPU function in `engine/` and follows its conventions exactly: NHWC
//! images, Keras's `[kh, kw, cin, cout]` kernels, TensorFlow's `same` padding (extra padding
//! after), first-wins ties for max pooling and argmax, batch-norm sums in double. Reductions
//! run one block per output in a fixed order, and gradients that several outputs share are
//! gathered rather than scattered with atomics, so a step is deterministic run to run.

use super::error::CudaError;
use cudarc::nvrtc::{CompileOptions, Ptx};

/// Threads per block of every kernel here (the reductions' shared arrays have this size).
pub const BLOCK: u32 = 256;

/// Activation codes shared with the kernels (`spec::Activation` minus softmax, which has its
/// own row kernels).
pub const ACT_LINEAR: i32 = 0;
/// `max(x, 0)`.
pub const ACT_RELU: i32 = 1;
/// Logistic function.
pub const ACT_SIGMOID: i32 = 2;
/// Hyperbolic tangent.
pub const ACT_TANH: i32 = 3;

/// Kernels the source defines; the device loads each by name.
pub const NAMES: &[&str] = &[
    "fill",
    "bias_act_fwd",
    "act_bwd",
    "softmax_fwd",
    "softmax_bwd",
    "col_sum",
    "sce_logits",
    "im2col",
    "col2im",
    "max_pool_fwd",
    "max_pool_bwd",
    "gap_fwd",
    "gap_bwd",
    "channel_sums",
    "bn_stats",
    "bn_fwd",
    "bn_bwd_coef",
    "bn_bwd",
    "add_relu",
    "relu_mask",
    "add",
    "sgd",
];

/// The CUDA C source of every kernel.
pub const SOURCE: &str = r#"
#define BLOCK 256
#define NEG_INF __int_as_float(0xff800000)
#define GRID_STRIDE(i, n) for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)blockDim.x * gridDim.x)

__device__ float sigmoidf_(float x) {
    if (x >= 0.0f) { return 1.0f / (1.0f + expf(-x)); }
    float e = expf(x);
    return e / (1.0f + e);
}

__device__ float act_f(float v, int act) {
    switch (act) {
        case 1: return v < 0.0f ? 0.0f : v;  // a NaN passes, as on the CPU
        case 2: return sigmoidf_(v);
        case 3: return tanhf(v);
        default: return v;
    }
}

extern "C" __global__ void fill(float* a, long long n, float value) {
    GRID_STRIDE(i, n) { a[i] = value; }
}

// y = act(y + bias) over rows of `cols` values; bias may be null.
extern "C" __global__ void bias_act_fwd(float* y, const float* bias, long long rows, int cols, int act) {
    GRID_STRIDE(i, rows * cols) {
        float v = y[i];
        if (bias) { v += bias[i % cols]; }
        y[i] = act_f(v, act);
    }
}

// dz = dy * act'(.), from the activation's output y (as engine/activation.rs).
extern "C" __global__ void act_bwd(const float* y, const float* dy, float* dz, long long n, int act) {
    GRID_STRIDE(i, n) {
        float g = dy[i], o = y[i];
        switch (act) {
            case 1: g = o > 0.0f ? g : 0.0f; break;
            case 2: g = g * o * (1.0f - o); break;
            case 3: g = g * (1.0f - o * o); break;
            default: break;
        }
        dz[i] = g;
    }
}

// Softmax of each row in place, shifted by its maximum; one thread per row.
extern "C" __global__ void softmax_fwd(float* y, long long rows, int cols) {
    GRID_STRIDE(r, rows) {
        float* row = y + r * cols;
        float m = NEG_INF;
        for (int j = 0; j < cols; ++j) { m = fmaxf(m, row[j]); }
        float s = 0.0f;
        for (int j = 0; j < cols; ++j) { row[j] = expf(row[j] - m); s += row[j]; }
        for (int j = 0; j < cols; ++j) { row[j] /= s; }
    }
}

// dz = y * (dy - <y, dy>) per row.
extern "C" __global__ void softmax_bwd(const float* y, const float* dy, float* dz, long long rows, int cols) {
    GRID_STRIDE(r, rows) {
        const float* yr = y + r * cols;
        const float* gr = dy + r * cols;
        float dot = 0.0f;
        for (int j = 0; j < cols; ++j) { dot += yr[j] * gr[j]; }
        for (int j = 0; j < cols; ++j) { dz[r * cols + j] = yr[j] * (gr[j] - dot); }
    }
}

// dst[c] (+)= sum over rows of src[r, c]: one block per column, fixed order.
extern "C" __global__ void col_sum(const float* src, long long rows, int cols, float* dst, int accumulate) {
    __shared__ float part[BLOCK];
    int c = blockIdx.x;
    float s = 0.0f;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) { s += src[r * cols + c]; }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) { part[threadIdx.x] += part[threadIdx.x + w]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { dst[c] = accumulate ? dst[c] + part[0] : part[0]; }
}

// Sparse categorical cross-entropy from logits (engine/loss.rs): per-row loss, whether the
// argmax (first on ties) is the label, and scale * dloss/dlogits.
extern "C" __global__ void sce_logits(const float* logits, const unsigned int* labels, long long rows, int classes,
                                      float scale, float* dlogits, float* loss, int* correct) {
    GRID_STRIDE(r, rows) {
        const float* row = logits + r * classes;
        int label = (int)labels[r];
        float m = NEG_INF;
        int best = 0;
        for (int j = 0; j < classes; ++j) {
            m = fmaxf(m, row[j]);
            if (row[j] > row[best]) { best = j; }
        }
        float s = 0.0f;
        for (int j = 0; j < classes; ++j) { s += expf(row[j] - m); }
        for (int j = 0; j < classes; ++j) {
            float t = j == label ? 1.0f : 0.0f;
            dlogits[r * classes + j] = scale * (expf(row[j] - m) / s - t);
        }
        loss[r] = logf(s) + m - row[label];
        correct[r] = best == label ? 1 : 0;
    }
}

// Patches of NHWC images as rows of kh*kw*c values (Window::im2col): zero outside the image.
extern "C" __global__ void im2col(const float* x, float* patches, long long images, int h, int w, int c,
                                  int kh, int kw, int sh, int sw, int pt, int pl, int oh, int ow) {
    long long plen = (long long)kh * kw * c;
    long long total = images * oh * ow * plen;
    GRID_STRIDE(i, total) {
        long long row = i / plen;
        int col = (int)(i % plen);
        int ch = col % c, kx = (col / c) % kw, ky = col / (c * kw);
        long long e = row / ((long long)oh * ow);
        int pos = (int)(row % ((long long)oh * ow));
        int oy = pos / ow, ox = pos % ow;
        int iy = oy * sh + ky - pt, ix = ox * sw + kx - pl;
        float v = 0.0f;
        if (iy >= 0 && iy < h && ix >= 0 && ix < w) { v = x[((e * h + iy) * w + ix) * c + ch]; }
        patches[i] = v;
    }
}

// The transpose of im2col, gathered per input value (no atomics): dx = sum of the patch
// gradients that read it.
extern "C" __global__ void col2im(const float* patches, float* dx, long long images, int h, int w, int c,
                                  int kh, int kw, int sh, int sw, int pt, int pl, int oh, int ow) {
    long long plen = (long long)kh * kw * c;
    GRID_STRIDE(i, images * h * w * c) {
        int ch = (int)(i % c);
        long long p = i / c;
        int ix = (int)(p % w), iy = (int)((p / w) % h);
        long long e = p / ((long long)w * h);
        float s = 0.0f;
        for (int ky = 0; ky < kh; ++ky) {
            int ty = iy + pt - ky;
            if (ty < 0 || ty % sh != 0) { continue; }
            int oy = ty / sh;
            if (oy >= oh) { continue; }
            for (int kx = 0; kx < kw; ++kx) {
                int tx = ix + pl - kx;
                if (tx < 0 || tx % sw != 0) { continue; }
                int ox = tx / sw;
                if (ox >= ow) { continue; }
                long long row = (e * oh + oy) * ow + ox;
                s += patches[row * plen + (ky * kw + kx) * c + ch];
            }
        }
        dx[i] = s;
    }
}

// Max over each window of real pixels, in row-major window order, first wins on ties;
// argmax is the flat index inside the image (MaxPool2d).
extern "C" __global__ void max_pool_fwd(const float* x, float* y, int* argmax, long long images, int h, int w, int c,
                                        int kh, int kw, int sh, int sw, int pt, int pl, int oh, int ow) {
    GRID_STRIDE(i, images * oh * ow * c) {
        int ch = (int)(i % c);
        long long p = i / c;
        int ox = (int)(p % ow), oy = (int)((p / ow) % oh);
        long long e = p / ((long long)ow * oh);
        int y0 = max(oy * sh - pt, 0), y1 = min(oy * sh - pt + kh, h);
        int x0 = max(ox * sw - pl, 0), x1 = min(ox * sw - pl + kw, w);
        const float* img = x + e * h * w * c;
        float m = 0.0f;
        int at = 0, first = 1;
        for (int iy = y0; iy < y1; ++iy) {
            for (int ix = x0; ix < x1; ++ix) {
                int idx = (iy * w + ix) * c + ch;
                float v = img[idx];
                if (first || v > m || v != v) { m = v; at = idx; first = 0; }  // a NaN stays, as on the CPU
            }
        }
        y[i] = m;
        argmax[i] = at;
    }
}

// dx[idx] = sum of dy over the windows whose maximum was idx (gathered, no atomics).
extern "C" __global__ void max_pool_bwd(const float* dy, const int* argmax, float* dx, long long images, int h, int w,
                                        int c, int kh, int kw, int sh, int sw, int pt, int pl, int oh, int ow) {
    GRID_STRIDE(i, images * h * w * c) {
        int ch = (int)(i % c);
        long long p = i / c;
        int ix = (int)(p % w), iy = (int)((p / w) % h);
        long long e = p / ((long long)w * h);
        int idx = (iy * w + ix) * c + ch;
        float s = 0.0f;
        for (int ky = 0; ky < kh; ++ky) {
            int ty = iy + pt - ky;
            if (ty < 0 || ty % sh != 0) { continue; }
            int oy = ty / sh;
            if (oy >= oh) { continue; }
            for (int kx = 0; kx < kw; ++kx) {
                int tx = ix + pl - kx;
                if (tx < 0 || tx % sw != 0) { continue; }
                int ox = tx / sw;
                if (ox >= ow) { continue; }
                long long o = ((e * oh + oy) * ow + ox) * c + ch;
                if (argmax[o] == idx) { s += dy[o]; }
            }
        }
        dx[i] = s;
    }
}

// Mean of each channel over hw positions.
extern "C" __global__ void gap_fwd(const float* x, float* y, long long images, int hw, int c) {
    GRID_STRIDE(i, images * c) {
        long long e = i / c;
        int ch = (int)(i % c);
        float s = 0.0f;
        for (int p = 0; p < hw; ++p) { s += x[(e * hw + p) * c + ch]; }
        y[i] = s * (1.0f / (float)hw);
    }
}

extern "C" __global__ void gap_bwd(const float* dy, float* dx, long long images, int hw, int c) {
    GRID_STRIDE(i, images * hw * c) {
        long long e = i / ((long long)hw * c);
        int ch = (int)(i % c);
        dx[i] = dy[e * c + ch] * (1.0f / (float)hw);
    }
}

// out[ch] = sum a, out[c + ch] = sum a*b over rows, in double: one block per channel.
extern "C" __global__ void channel_sums(const float* a, const float* b, long long rows, int c, double* out) {
    __shared__ double s[BLOCK];
    __shared__ double sp[BLOCK];
    int ch = blockIdx.x;
    double x = 0.0, xy = 0.0;
    for (long long r = threadIdx.x; r < rows; r += blockDim.x) {
        double va = (double)a[r * c + ch];
        x += va;
        xy += va * (double)b[r * c + ch];
    }
    s[threadIdx.x] = x;
    sp[threadIdx.x] = xy;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) { s[threadIdx.x] += s[threadIdx.x + w]; sp[threadIdx.x] += sp[threadIdx.x + w]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) { out[ch] = s[0]; out[c + ch] = sp[0]; }
}

// Batch (training) or moving (inference) statistics; training moves the moving ones with the
// biased batch variance, as Keras 3 does (BatchNorm::forward).
extern "C" __global__ void bn_stats(const double* sums, long long rows, int c, float momentum, float eps, int training,
                                    float* moving_mean, float* moving_var, float* mean, float* inv_std) {
    GRID_STRIDE(ch, c) {
        float mu, var;
        if (training) {
            double m = rows > 0 ? (double)rows : 1.0;
            double dm = sums[ch] / m;
            mu = (float)dm;
            var = (float)fmax(sums[c + ch] / m - dm * dm, 0.0);
            moving_mean[ch] = moving_mean[ch] * momentum + mu * (1.0f - momentum);
            moving_var[ch] = moving_var[ch] * momentum + var * (1.0f - momentum);
        } else {
            mu = moving_mean[ch];
            var = moving_var[ch];
        }
        mean[ch] = mu;
        inv_std[ch] = 1.0f / sqrtf(var + eps);
    }
}

// y = gamma * (x - mean) * inv_std + beta, as scale * x + shift.
extern "C" __global__ void bn_fwd(const float* x, float* y, const float* gamma, const float* beta, const float* mean,
                                  const float* inv_std, long long n, int c) {
    GRID_STRIDE(i, n) {
        int ch = (int)(i % c);
        float scale = gamma[ch] * inv_std[ch];
        float shift = beta[ch] - mean[ch] * scale;
        y[i] = scale * x[i] + shift;
    }
}

// Parameter gradients from sums (sum dy, sum dy*x) and the coefficients of dx = a*dy + k*x + d.
extern "C" __global__ void bn_bwd_coef(const double* sums, long long rows, int c, int training, const float* gamma,
                                       const float* mean, const float* inv_std, float* g_gamma, float* g_beta,
                                       int accumulate, float* coef) {
    GRID_STRIDE(ch, c) {
        double sdy = sums[ch], sdyx = sums[c + ch];
        double dgamma = (double)inv_std[ch] * (sdyx - (double)mean[ch] * sdy);
        g_gamma[ch] = (accumulate ? g_gamma[ch] : 0.0f) + (float)dgamma;
        g_beta[ch] = (accumulate ? g_beta[ch] : 0.0f) + (float)sdy;
        float a = gamma[ch] * inv_std[ch];
        float k = 0.0f, d = 0.0f;
        if (training) {
            double m = rows > 0 ? (double)rows : 1.0;
            double da = (double)a, s = (double)inv_std[ch], mu = (double)mean[ch];
            double kk = -da * s * dgamma / m;
            k = (float)kk;
            d = (float)(-da * sdy / m - kk * mu);
        }
        coef[ch] = a;
        coef[c + ch] = k;
        coef[2 * c + ch] = d;
    }
}

extern "C" __global__ void bn_bwd(const float* dy, const float* x, float* dx, const float* coef, long long n, int c) {
    GRID_STRIDE(i, n) {
        int ch = (int)(i % c);
        dx[i] = coef[ch] * dy[i] + coef[c + ch] * x[i] + coef[2 * c + ch];
    }
}

// a = max(a + b, 0): a residual block's join.
extern "C" __global__ void add_relu(float* a, const float* b, long long n) {
    GRID_STRIDE(i, n) { float v = a[i] + b[i]; a[i] = v < 0.0f ? 0.0f : v; }
}

// g = y > 0 ? g : 0: relu's backward from its output.
extern "C" __global__ void relu_mask(float* g, const float* y, long long n) {
    GRID_STRIDE(i, n) { g[i] = y[i] > 0.0f ? g[i] : 0.0f; }
}

extern "C" __global__ void add(float* a, const float* b, long long n) {
    GRID_STRIDE(i, n) { a[i] += b[i]; }
}

// Keras's SGD over the flat arena (engine/optimizer/sgd.rs); v may be null (no momentum).
extern "C" __global__ void sgd(float* p, const float* g, float* v, long long n, float lr, float momentum, float wd,
                               int nesterov) {
    GRID_STRIDE(i, n) {
        float gi = g[i] + wd * p[i];
        if (v) {
            float vi = momentum * v[i] - lr * gi;
            v[i] = vi;
            p[i] += nesterov ? momentum * vi - lr * gi : vi;
        } else {
            p[i] -= lr * gi;
        }
    }
}
"#;

/// Compiles [`SOURCE`] to PTX; probe NVRTC first ([`super::probe::Library::Nvrtc`]).
///
/// No `arch` is set: the PTX targets NVRTC's default virtual architecture and the driver
/// compiles it for whatever GPU loads it.
pub fn compile() -> Result<Ptx, CudaError> {
    let opts = CompileOptions { name: Some("trainrun_kernels.cu".into()), ..CompileOptions::default() };
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| CudaError::Compile { module: "trainrun", log: format!("{e:?}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_once() {
        for name in NAMES {
            let sig = format!("__global__ void {name}(");
            assert_eq!(SOURCE.matches(&sig).count(), 1, "{name}");
        }
        assert_eq!(SOURCE.matches("extern \"C\" __global__").count(), NAMES.len());
    }
}
