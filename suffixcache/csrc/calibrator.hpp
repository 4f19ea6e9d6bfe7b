// Online estimate of P(draft token accepted | its parent accepted), learned
// from the verifier's verdicts.
//
// A token is described by discrete features: its raw conditional probability
// under the suffix-tree mixture, the occurrences supporting it, its depth in
// the draft, the context's match length, its source, and how many tokens the
// previous step of the same session had accepted. Bins are nested from coarse
// (raw probability only) to fine (all features); each level's estimate is
// shrunk towards the coarser level's, so that sparse fine bins borrow strength
// and well-populated ones speak for themselves:
//
//     p_0 = raw probability;  p_l = (hits_l + w * p_{l-1}) / (trials_l + w)
//
// Only tokens whose parent was accepted are evidence: the verifier never judged
// the others, so truncating drafts does not bias the estimate.
//
// On top of the bins, a logistic correction learned online (Adagrad) over
// content features the bins cannot hold: the token's own id, the (previous
// token, token) pair, and the token id crossed with the source, with the
// previous-step acceptance and with the match length. Some tokens are reliably rejected whatever the
// counts say (in the replayed traces, the role header that follows every
// earlier response: a draft running past the end of a response), others are
// near-certain (punctuation inside identifiers). And the token's backoff
// probabilities, how often the last 1, 2, 3 tokens alone are continued with
// it: alone, crossed with each other, with the raw probability, and with depth
// and support (a deep token the long match saw once, that its short context
// rarely continues with, is a guess). And whether the conversation used the token
// recently (alone, with depth and the backoff, and with the token id), and whether it
// used the pair (token before it, token) recently (the same three ways):
//
//     p = sigmoid(a * logit(p_bins) + sum_k w[hash(feature_k)])
//
// a (a learned temperature on the bins' estimate, starting at 1) and w
// (hashed into a fixed table, starting at 0) follow the gradient of the log
// loss, so before any evidence p equals the bins' estimate.
//
// Thread safety: none inside; the Python layer serialises access.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace suffixcache {

struct TokenFeatures {
    double cond;       // raw P(token | parent) under the mixture
    int32_t support;   // occurrences behind the token
    int32_t depth;     // 1-based depth in the draft
    int32_t match_len; // longest matched context suffix
    int32_t source;    // 0 session, 1 global, 2 corpus, 3 other
    int32_t prev;      // tokens accepted at the session's previous step; -1 = it had no draft
    int32_t token = -1;       // the drafted token id
    int32_t prev_token = -1;  // the token before it (the context's last token for the first)
    // P(token | the 1, 2, 3 tokens before it) over the trees (backoff_probs in
    // suffix_tree.hpp); nullptr or -1 = unknown
    const float* backoff = nullptr;
    // the smallest of the last 32, 128, 512 tokens of the session's transcript that
    // holds the token (0, 1, 2), 3 if none; -1 = unknown (recency_buckets)
    int32_t recent = -1;
    // the same for the pair (token before it, token): pair_recency_buckets
    int32_t recent_pair = -1;
};

class Calibrator {
  public:
    static constexpr int kLevels = 6;
    explicit Calibrator(double prior_weight = 4.0, double optimism = 1.0);

    // The estimate plus an optimism bonus that shrinks with the evidence in the
    // token's finest bin (an upper confidence bound). Without it a bin that
    // started with a few rejections would stop being drafted, and so never be
    // judged again: drafts that are cut short leave their tail unverified. (The
    // Drafter measures no gain from it on its workloads and sets it to 0; see
    // CALIBRATION_OPTIMISM in drafter.py.)
    double estimate(const TokenFeatures& f) const;
    void observe(const TokenFeatures& f, bool accepted);
    double trials() const { return total_trials_; }

    static constexpr int kContentFeatures = 17;
    static constexpr int kBackoffValues = 3;  // TokenFeatures::backoff's length
    static constexpr uint32_t kTableBits = 20;

  private:
    void bins(const TokenFeatures& f, std::array<int32_t, kLevels>* out) const;
    double binned(const TokenFeatures& f) const;  // the bins' estimate with its optimism bonus
    void content_keys(const TokenFeatures& f, std::array<uint32_t, kContentFeatures>* out) const;
    double logit_of(const TokenFeatures& f, double p_bins, std::array<uint32_t, kContentFeatures>* keys) const;
    double prior_weight_;
    double optimism_;
    std::array<std::vector<float>, kLevels> hits_;
    std::array<std::vector<float>, kLevels> trials_;
    double total_trials_ = 0.0;
    // logistic correction: hashed weights, their Adagrad accumulators, the temperature
    std::vector<float> weights_;
    std::vector<float> grad_sq_;
    double scale_ = 1.0;
    double scale_grad_sq_ = 1.0;
};

}  // namespace suffixcache
