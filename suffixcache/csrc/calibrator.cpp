#include "calibrator.hpp"

#include <algorithm>
#include <cmath>

namespace suffixcache {

namespace {

template <size_t N>
int32_t bucket(double v, const double (&edges)[N]) {
    for (size_t i = 0; i < N; ++i)
        if (v <= edges[i]) return static_cast<int32_t>(i);
    return static_cast<int32_t>(N);
}

// coarse features
constexpr double kCond[] = {0.3, 0.6, 0.9, 0.99};         // 5 buckets
constexpr double kSupport[] = {1, 2, 4, 8, 16};           // 6
constexpr double kDepth[] = {1, 3, 7};                     // 4
constexpr double kMatch[] = {2, 5, 10};                    // 4
// fine features
constexpr double kCondF[] = {0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99};  // 8
constexpr double kSupportF[] = {1, 2, 3, 4, 6, 8, 16, 32};          // 9
constexpr double kDepthF[] = {1, 2, 3, 4, 6, 8, 12};                // 8
constexpr double kMatchF[] = {1, 2, 3, 4, 6, 8, 12, 16, 24};        // 10
constexpr double kPrev[] = {-1, 0, 2, 6};                            // 5
constexpr double kBackoff[] = {0.05, 0.2, 0.4, 0.6, 0.8, 0.95};      // 7, and 7 = unknown
constexpr int32_t kSources = 4;
// Adagrad of the logistic correction: step size, and the accumulators' start (which
// bounds the first steps at kLearningRate / sqrt(kGradSqInit) per unit of gradient)
constexpr double kLearningRate = 0.1;
constexpr float kGradSqInit = 1e-2f;

constexpr int32_t kSizes[Calibrator::kLevels] = {
    5, 5 * 6, 5 * 6 * 4, 5 * 6 * 4 * 4, 8 * 9 * 8 * 10, 8 * 9 * 8 * 10 * kSources * 5,
};

}  // namespace

Calibrator::Calibrator(double prior_weight, double optimism) : prior_weight_(prior_weight), optimism_(optimism) {
    for (int l = 0; l < kLevels; ++l) {
        hits_[l].assign(kSizes[l], 0.0f);
        trials_[l].assign(kSizes[l], 0.0f);
    }
    weights_.assign(size_t{1} << kTableBits, 0.0f);
    grad_sq_.assign(size_t{1} << kTableBits, kGradSqInit);
}

void Calibrator::bins(const TokenFeatures& f, std::array<int32_t, kLevels>* out) const {
    const int32_t c = bucket(f.cond, kCond), s = bucket(f.support, kSupport), d = bucket(f.depth, kDepth),
                  m = bucket(f.match_len, kMatch);
    (*out)[0] = c;
    (*out)[1] = c * 6 + s;
    (*out)[2] = (*out)[1] * 4 + d;
    (*out)[3] = (*out)[2] * 4 + m;
    const int32_t fine = ((bucket(f.cond, kCondF) * 9 + bucket(f.support, kSupportF)) * 8 + bucket(f.depth, kDepthF)) *
                             10 +
                         bucket(f.match_len, kMatchF);
    (*out)[4] = fine;
    const int32_t src = std::clamp<int32_t>(f.source, 0, kSources - 1);
    (*out)[5] = (fine * kSources + src) * 5 + bucket(f.prev, kPrev);
}

double Calibrator::binned(const TokenFeatures& f) const {
    std::array<int32_t, kLevels> b;
    bins(f, &b);
    double p = std::clamp(f.cond, 0.0, 1.0);
    for (int l = 0; l < kLevels; ++l) p = (hits_[l][b[l]] + prior_weight_ * p) / (trials_[l][b[l]] + prior_weight_);
    const double n = trials_[kLevels - 1][b[kLevels - 1]];
    return std::min(1.0, p + optimism_ * std::sqrt(p * (1.0 - p) / (n + prior_weight_)));
}

void Calibrator::content_keys(const TokenFeatures& f, std::array<uint32_t, kContentFeatures>* out) const {
    const uint64_t tok = static_cast<uint32_t>(f.token);
    const uint64_t before = static_cast<uint32_t>(f.prev_token);
    const uint64_t src = static_cast<uint64_t>(std::clamp<int32_t>(f.source, 0, kSources - 1));
    const uint64_t prev = static_cast<uint64_t>(bucket(f.prev, kPrev));
    const uint64_t match = static_cast<uint64_t>(bucket(f.match_len, kMatch));
    uint64_t b[kBackoffValues];
    for (int j = 0; j < kBackoffValues; ++j) {
        const float v = f.backoff ? f.backoff[j] : -1.0f;
        b[j] = v < 0.0f ? 7 : static_cast<uint64_t>(bucket(v, kBackoff));
    }
    const uint64_t cond = static_cast<uint64_t>(bucket(f.cond, kCond));
    const uint64_t depth = static_cast<uint64_t>(bucket(f.depth, kDepth));
    const uint64_t support = static_cast<uint64_t>(bucket(f.support, kSupport));
    // 0..3 from recency_buckets, 4 = unknown; near: in the last 128 tokens (2 = unknown)
    const uint64_t recent = f.recent < 0 ? 4 : static_cast<uint64_t>(std::min<int32_t>(f.recent, 3));
    const uint64_t near = f.recent < 0 ? 2 : (f.recent <= 1 ? 1 : 0);
    // the pair: 0 in the last 128 tokens, 1 in the last 512, 2 not, 3 unknown;
    // pair_seen: in the last 512 (2 = unknown)
    const uint64_t pair = f.recent_pair < 0 ? 3 : (f.recent_pair <= 1 ? 0 : (f.recent_pair == 2 ? 1 : 2));
    const uint64_t pair_seen = f.recent_pair < 0 ? 2 : (f.recent_pair <= 2 ? 1 : 0);
    const uint64_t raw[kContentFeatures] = {
        (1ull << 60) | tok,
        (2ull << 60) | (before << 32) | tok,
        (3ull << 60) | (src << 32) | tok,
        (4ull << 60) | (prev << 32) | tok,
        (5ull << 60) | (match << 32) | tok,
        (6ull << 60) | b[0],
        (7ull << 60) | b[1],
        (8ull << 60) | b[2],
        (9ull << 60) | (b[1] << 4) | b[2],
        (10ull << 60) | (b[1] << 4) | cond,
        (11ull << 60) | (b[2] << 8) | (depth << 4) | support,
        (12ull << 60) | recent,
        (13ull << 60) | (recent << 8) | (depth << 4) | b[2],
        (14ull << 60) | (near << 32) | tok,
        (15ull << 60) | pair,
        (16ull << 60) | (pair << 8) | (depth << 4) | b[2],
        (17ull << 60) | (pair_seen << 32) | tok,
    };
    for (int i = 0; i < kContentFeatures; ++i) {
        uint64_t h = raw[i] * 0x9E3779B97F4A7C15ull;  // Fibonacci hashing: the high bits are well mixed
        (*out)[i] = static_cast<uint32_t>(h >> (64 - kTableBits));
    }
}

namespace {
double logit(double p) {
    p = std::clamp(p, 1e-4, 1.0 - 1e-4);
    return std::log(p / (1.0 - p));
}
double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-std::clamp(z, -30.0, 30.0))); }
}  // namespace

double Calibrator::logit_of(const TokenFeatures& f, double p_bins,
                            std::array<uint32_t, kContentFeatures>* keys) const {
    content_keys(f, keys);
    double z = scale_ * logit(p_bins);
    for (uint32_t k : *keys) z += weights_[k];
    return z;
}

double Calibrator::estimate(const TokenFeatures& f) const {
    std::array<uint32_t, kContentFeatures> keys;
    return sigmoid(logit_of(f, binned(f), &keys));
}

void Calibrator::observe(const TokenFeatures& f, bool accepted) {
    // the correction learns from the estimate the drafter used, before the bins move
    std::array<uint32_t, kContentFeatures> keys;
    const double p_bins = binned(f);
    const double g = sigmoid(logit_of(f, p_bins, &keys)) - (accepted ? 1.0 : 0.0);
    for (uint32_t k : keys) {
        grad_sq_[k] += static_cast<float>(g * g);
        weights_[k] -= static_cast<float>(kLearningRate * g / std::sqrt(grad_sq_[k]));
    }
    const double gs = g * logit(p_bins);
    scale_grad_sq_ += gs * gs;
    scale_ -= kLearningRate * gs / std::sqrt(scale_grad_sq_);
    std::array<int32_t, kLevels> b;
    bins(f, &b);
    for (int l = 0; l < kLevels; ++l) {
        trials_[l][b[l]] += 1.0f;
        if (accepted) hits_[l][b[l]] += 1.0f;
    }
    total_trials_ += 1.0;
}

}  // namespace suffixcache
