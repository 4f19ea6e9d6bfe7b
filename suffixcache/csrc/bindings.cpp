// Python bindings of the suffix-tree core. Argument conversion and validation
// happen with the GIL held; the tree work itself runs with the GIL released.
#include <pybind11/pybind11.h>
#include <algorithm>
#include <iterator>
#include <pybind11/stl.h>

#include "calibrator.hpp"
#include "suffix_tree.hpp"

namespace py = pybind11;
using namespace suffixcache;

namespace {

constexpr int64_t kMaxSeqId = (int64_t{1} << 62);

// Accepts any sequence of Python ints (list, tuple, array('i'), numpy int array).
std::vector<Token> to_tokens(const py::handle& obj, const char* what, int64_t vocab_size) {
    if (py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj))
        throw py::type_error(std::string(what) + " must be a sequence of int token ids, not str/bytes");
    if (!py::isinstance<py::sequence>(obj) && !py::hasattr(obj, "__iter__"))
        throw py::type_error(std::string(what) + " must be a sequence of int token ids");
    std::vector<Token> out;
    if (py::isinstance<py::sequence>(obj)) out.reserve(py::len(obj));
    for (const py::handle& item : obj) {
        if (py::isinstance<py::bool_>(item) || !py::isinstance<py::int_>(item)) {
            // numpy integer scalars are not py::int_ but index cleanly
            if (!py::hasattr(item, "__index__") || py::isinstance<py::bool_>(item))
                throw py::type_error(std::string(what) + " must hold ints, got " +
                                     std::string(py::str(py::type::of(item).attr("__name__"))));
        }
        long long v;
        try {
            v = py::reinterpret_steal<py::int_>(PyNumber_Index(item.ptr())).cast<long long>();
        } catch (const py::error_already_set&) {
            throw py::type_error(std::string(what) + " must hold ints");
        } catch (const py::cast_error&) {
            throw py::value_error(std::string(what) + ": token id out of range");
        }
        if (v < 0 || v > INT32_MAX)
            throw py::value_error(std::string(what) + ": token id " + std::to_string(v) + " is out of range");
        if (vocab_size > 0 && v >= vocab_size)
            throw py::value_error(std::string(what) + ": token id " + std::to_string(v) +
                                  " is not below the vocabulary size " + std::to_string(vocab_size));
        out.push_back(static_cast<Token>(v));
    }
    return out;
}

void check_seq_id(int64_t seq_id) {
    if (seq_id < 0 || seq_id >= kMaxSeqId) throw py::value_error("seq_id must be in [0, 2**62)");
}

SpecParams make_params(int max_tokens, double factor, double offset, double min_prob, int max_match, bool use_tree) {
    if (max_tokens < 0 || max_tokens > 1024) throw py::value_error("max_tokens must be in [0, 1024]");
    if (!(factor >= 0.0) || factor > 1e6) throw py::value_error("max_spec_factor must be >= 0");
    if (!(offset > -1e6) || offset > 1e6) throw py::value_error("max_spec_offset is out of range");
    if (!(min_prob >= 0.0) || min_prob > 1.0) throw py::value_error("min_token_prob must be in [0, 1]");
    if (max_match < 0) throw py::value_error("max_match must be >= 0");
    SpecParams p;
    p.max_tokens = max_tokens;
    p.max_spec_factor = factor;
    p.max_spec_offset = offset;
    p.min_token_prob = min_prob;
    p.max_match = max_match;
    p.use_tree = use_tree;
    return p;
}

py::dict draft_to_dict(Draft&& d) {
    py::dict out;
    out["tokens"] = py::cast(d.tokens);
    out["parents"] = py::cast(d.parents);
    out["probs"] = py::cast(d.probs);
    out["sources"] = py::cast(d.sources);
    out["counts"] = py::cast(d.counts);
    out["seq_ids"] = py::cast(d.seq_ids);
    out["match_lens"] = py::cast(d.match_lens);
    out["score"] = d.score;
    if (!d.backoff.empty()) out["backoff"] = py::cast(d.backoff);
    if (!d.recency.empty()) out["recency"] = py::cast(std::vector<int32_t>(d.recency.begin(), d.recency.end()));
    if (!d.pair_recency.empty())
        out["pair_recency"] = py::cast(std::vector<int32_t>(d.pair_recency.begin(), d.pair_recency.end()));
    return out;
}

class PyTree {
  public:
    PyTree(int max_depth, int64_t vocab_size) : tree_(max_depth), vocab_size_(vocab_size) {
        if (vocab_size < 0) throw py::value_error("vocab_size must be >= 0 (0 = unchecked)");
    }
    SuffixTree tree_;
    int64_t vocab_size_;
};

}  // namespace

static_assert(kNumBackoff == Calibrator::kBackoffValues, "the calibrator reads every backoff estimate");

namespace {

constexpr int32_t kNoRecency = static_cast<int32_t>(std::size(kRecencyWindows));  // in none of the windows

// One draft's calibrator inputs as parallel arrays, borrowed from vectors that outlive
// it: either Python lists converted by Calibrator.choose/observe, or a NativeDraft's.
struct FeatureView {
    size_t n = 0;
    const double* conds = nullptr;     // raw P(token | parent)
    const int32_t* supports = nullptr;
    const int32_t* parents = nullptr;  // pointing backwards (checked where the view is built)
    const int32_t* sources = nullptr;  // the calibrator's source ids
    const int32_t* tokens = nullptr;   // nullptr: unknown (no content features)
    const float* backoff = nullptr;    // kNumBackoff a token; nullptr: unknown
    const int8_t* recency = nullptr;   // nullptr: unknown
    const int8_t* pair_recency = nullptr;
    int32_t match_len = 0;
    int32_t prev = -1;
    int32_t last_token = -1;

    TokenFeatures at(size_t i, int32_t depth) const {
        const int32_t p = parents[i];
        return {conds[i],
                supports[i],
                depth,
                match_len,
                sources[i],
                prev,
                tokens ? tokens[i] : -1,
                tokens ? (p < 0 ? last_token : tokens[p]) : -1,
                backoff ? backoff + i * kNumBackoff : nullptr,
                recency ? recency[i] : -1,
                pair_recency ? pair_recency[i] : -1};
    }
};

// Cumulative acceptance estimates of a draft and the prefix worth verifying: the one
// maximising expected tokens - rate * cost(prefix + 1) (see drafter.py).
std::pair<std::vector<double>, size_t> choose_prefix(const Calibrator& cal, const FeatureView& v,
                                                     const std::vector<double>& costs, double rate,
                                                     bool cost_aware) {
    const size_t n = v.n;
    if (costs.size() < n + 2) throw py::value_error("cost table too short for the draft");
    // On a path, once a token's cumulative estimate is below rate times the cheapest
    // marginal cost, no longer prefix can beat the one ending there (every later token
    // is likelier still to be rejected and costs at least that much): the rest is not
    // estimated (probability 0).
    bool path = cost_aware;
    double cheapest = 1e300;
    for (size_t i = 0; i < n && path; ++i) {
        path = v.parents[i] == static_cast<int32_t>(i) - 1;
        cheapest = std::min(cheapest, costs[i + 2] - costs[i + 1]);
    }
    const double stop_below = path ? rate * cheapest : -1.0;
    std::vector<double> probs(n, 0.0);
    std::vector<int32_t> depth(n);
    for (size_t i = 0; i < n; ++i) {
        const int32_t p = v.parents[i];
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        const double r = cal.estimate(v.at(i, depth[i]));
        probs[i] = p < 0 ? r : r * probs[p];
        if (probs[i] < stop_below) break;
    }
    size_t keep = n;
    if (cost_aware) {
        keep = 0;
        double expected = 1.0, best = 1.0 - rate * costs[1];
        for (size_t k = 1; k <= n; ++k) {
            expected += probs[k - 1];
            const double value = expected - rate * costs[k + 1];
            if (value > best) {
                best = value;
                keep = k;
            }
        }
    }
    return {std::move(probs), keep};
}

// Learns the draft's first hits.size() tokens, but the first `start` (learned before)
// and those whose parent was rejected (never judged by the verifier).
void learn_prefix(Calibrator& cal, const FeatureView& v, const std::vector<bool>& hits, int64_t start) {
    if (start < 0) throw py::value_error("start must be >= 0");
    if (hits.size() > v.n) throw py::value_error("more hits than draft tokens");
    std::vector<int32_t> depth(hits.size());
    for (size_t i = 0; i < hits.size(); ++i) {
        const int32_t p = v.parents[i];
        depth[i] = p < 0 ? 1 : depth[p] + 1;
        if (p >= 0 && !hits[p]) continue;
        if (static_cast<int64_t>(i) < start) continue;
        cal.observe(v.at(i, depth[i]), hits[i]);
    }
}

// Python lists of Calibrator.choose/observe, validated and held for a FeatureView.
struct ListFeatures {
    std::vector<int8_t> recency, pair_recency;

    ListFeatures(FeatureView* v, const std::vector<double>& conds, const std::vector<int32_t>& supports,
                 const std::vector<int32_t>& parents, const std::vector<int32_t>& sources,
                 const std::vector<int32_t>& tokens, const std::vector<float>& backoff,
                 const std::vector<int32_t>& recency_in, const std::vector<int32_t>& pair_in, int32_t match_len,
                 int32_t prev, int32_t last_token) {
        const size_t n = conds.size();
        if (supports.size() != n || parents.size() != n || sources.size() != n)
            throw py::value_error("draft feature lists differ in length");
        if (!tokens.empty() && tokens.size() != n) throw py::value_error("tokens differ in length from the draft");
        if (!backoff.empty() && backoff.size() != n * kNumBackoff)
            throw py::value_error("backoff must hold " + std::to_string(kNumBackoff) + " values per draft token");
        for (size_t i = 0; i < n; ++i)
            if (parents[i] >= static_cast<int32_t>(i) || parents[i] < -1)
                throw py::value_error("parents must point backwards");
        recency = buckets(recency_in, n, "recency");
        pair_recency = buckets(pair_in, n, "pair_recency");
        v->n = n;
        v->conds = conds.data();
        v->supports = supports.data();
        v->parents = parents.data();
        v->sources = sources.data();
        v->tokens = tokens.empty() ? nullptr : tokens.data();
        v->backoff = backoff.empty() ? nullptr : backoff.data();
        v->recency = recency.empty() ? nullptr : recency.data();
        v->pair_recency = pair_recency.empty() ? nullptr : pair_recency.data();
        v->match_len = match_len;
        v->prev = prev;
        v->last_token = last_token;
    }

    // The calibrator reads a bucket as unknown below 0 and as "none" above the last
    // window, so clamping to [-1, kNoRecency] changes nothing it computes.
    static std::vector<int8_t> buckets(const std::vector<int32_t>& in, size_t n, const char* name) {
        if (!in.empty() && in.size() != n) throw py::value_error(std::string(name) + " must hold one value per draft token");
        std::vector<int8_t> out(in.size());
        for (size_t i = 0; i < in.size(); ++i)
            out[i] = static_cast<int8_t>(std::clamp<int32_t>(in[i], -1, kNoRecency));
        return out;
    }
};

// A speculate_multi draft kept native for the Drafter: the calibrator reads its
// features in place, and Python converts only the prefix it keeps (converting every
// candidate's features to lists and back cost more than the draft itself).
struct NativeDraft {
    Draft d;
    std::vector<double> conds;     // raw P(token | parent): the mixture's probs, divided
    std::vector<int32_t> kinds;    // per token: the calibrator's id of its source
    int32_t match_len = 0;         // longest matched suffix over the sources

    FeatureView view(int32_t prev, int32_t last_token) const {
        FeatureView v;
        v.n = d.tokens.size();
        v.conds = conds.data();
        v.supports = d.counts.data();
        v.parents = d.parents.data();
        v.sources = kinds.data();
        v.tokens = d.tokens.data();
        v.backoff = d.backoff.empty() ? nullptr : d.backoff.data();
        v.recency = d.recency.empty() ? nullptr : d.recency.data();
        v.pair_recency = d.pair_recency.empty() ? nullptr : d.pair_recency.data();
        v.match_len = match_len;
        v.prev = prev;
        v.last_token = last_token;
        return v;
    }
};

// The checked inputs of speculate_multi, shared by its dict and its native form.
struct MultiArgs {
    std::vector<SuffixTree*> trees;
    std::vector<Token> context;
    SpecParams params;
};

MultiArgs multi_args(const py::list& trees, const std::vector<double>& weights, const std::vector<int64_t>& tail_seqs,
                     const py::object& context, int max_tokens, double factor, double offset, double min_prob,
                     int max_match, bool use_tree, double match_power) {
    if (trees.size() != weights.size() || trees.size() != tail_seqs.size())
        throw py::value_error("trees, weights and tail_seqs differ in length");
    if (trees.size() > 16) throw py::value_error("at most 16 sources");
    MultiArgs a;
    for (const py::handle& h : trees) a.trees.push_back(&h.cast<PyTree&>().tree_);
    for (size_t i = 0; i < a.trees.size(); ++i)
        for (size_t j = i + 1; j < a.trees.size(); ++j)
            if (a.trees[i] == a.trees[j]) throw py::value_error("the same tree was passed twice");
    for (double w : weights)
        if (!(w >= 0.0) || w > 1e12) throw py::value_error("weights must be finite and >= 0");
    if (!(match_power >= 0.0) || match_power > 16.0) throw py::value_error("match_power must be in [0, 16]");
    a.context = to_tokens(context, "context", 0);
    a.params = make_params(max_tokens, factor, offset, min_prob, max_match, use_tree);
    return a;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
    m.doc() = "Native suffix-tree core of suffixcache (see suffix_tree.hpp for the data structure).";

    py::class_<PyTree>(m, "SuffixTree",
                       "Multi-sequence, depth-limited suffix tree over int32 token ids with occurrence counts.\n\n"
                       "Not synchronised: callers serialise access to one tree (suffixcache.SuffixCache holds "
                       "a lock per tree). Native work runs with the GIL released.")
        .def(py::init<int, int64_t>(), py::arg("max_depth") = 64, py::arg("vocab_size") = 0)
        .def_property_readonly("max_depth", [](const PyTree& t) { return t.tree_.max_depth(); })
        .def_property_readonly("vocab_size", [](const PyTree& t) { return t.vocab_size_; })
        .def(
            "extend",
            [](PyTree& t, int64_t seq_id, const py::object& tokens) {
                check_seq_id(seq_id);
                std::vector<Token> v = to_tokens(tokens, "tokens", t.vocab_size_);
                py::gil_scoped_release release;
                t.tree_.extend(seq_id, v);
            },
            py::arg("seq_id"), py::arg("tokens"), "Append tokens to a sequence (created on first use).")
        .def(
            "remove",
            [](PyTree& t, int64_t seq_id) {
                check_seq_id(seq_id);
                py::gil_scoped_release release;
                return t.tree_.remove(seq_id);
            },
            py::arg("seq_id"), "Forget a sequence completely; False if unknown.")
        .def("__contains__", [](const PyTree& t, int64_t seq_id) { return t.tree_.contains(seq_id); })
        .def("seq_length",
             [](const PyTree& t, int64_t seq_id) {
                 int64_t n = t.tree_.seq_length(seq_id);
                 if (n < 0) throw py::key_error("unknown sequence " + std::to_string(seq_id));
                 return n;
             })
        .def("seq_tokens",
             [](const PyTree& t, int64_t seq_id) {
                 if (!t.tree_.contains(seq_id)) throw py::key_error("unknown sequence " + std::to_string(seq_id));
                 return t.tree_.seq_tokens(seq_id);
             })
        .def("seq_ids", [](const PyTree& t) { return t.tree_.seq_ids(); })
        .def(
            "count",
            [](const PyTree& t, const py::object& pattern) {
                std::vector<Token> v = to_tokens(pattern, "pattern", 0);
                py::gil_scoped_release release;
                return t.tree_.count(v);
            },
            py::arg("pattern"), "Occurrences of a token string (0 if absent or longer than max_depth).")
        .def(
            "speculate",
            [](PyTree& t, const py::object& context, int max_tokens, double factor, double offset, double min_prob,
               int max_match, bool use_tree) {
                std::vector<Token> ctx = to_tokens(context, "context", 0);
                SpecParams p = make_params(max_tokens, factor, offset, min_prob, max_match, use_tree);
                Draft d;
                {
                    py::gil_scoped_release release;
                    d = t.tree_.speculate(ctx, p);
                }
                return draft_to_dict(std::move(d));
            },
            py::arg("context"), py::arg("max_tokens") = 32, py::arg("max_spec_factor") = 1.0,
            py::arg("max_spec_offset") = 0.0, py::arg("min_token_prob") = 0.1, py::arg("max_match") = 0,
            py::arg("use_tree") = false,
            "Draft a continuation of context: dict(tokens, parents, probs, sources, match_lens, score).")
        .def_property_readonly("num_nodes", [](const PyTree& t) { return t.tree_.num_nodes(); })
        .def_property_readonly("num_sequences", [](const PyTree& t) { return t.tree_.num_sequences(); })
        .def_property_readonly("num_tokens", [](const PyTree& t) { return t.tree_.num_tokens(); })
        .def_property_readonly("retained_tokens", [](const PyTree& t) { return t.tree_.retained_tokens(); })
        .def_property_readonly("memory_bytes", [](const PyTree& t) { return t.tree_.memory_bytes(); })
        .def("check_integrity", [](const PyTree& t) {
            try {
                t.tree_.check_integrity();
            } catch (const std::logic_error& e) {
                throw py::value_error(e.what());
            }
        });

    // The calibrator's calls are a few microseconds: they keep the GIL, which
    // also serialises them (no lock needed around the learned tables).
    py::class_<Calibrator>(m, "Calibrator",
                           "Online estimate of P(draft token accepted | parent accepted); see calibrator.hpp.")
        .def(py::init([](double prior_weight, double optimism) {
                 if (!(prior_weight > 0.0) || prior_weight > 1e6) throw py::value_error("prior_weight must be > 0");
                 if (!(optimism >= 0.0) || optimism > 100.0) throw py::value_error("optimism must be in [0, 100]");
                 return Calibrator(prior_weight, optimism);
             }),
             py::arg("prior_weight") = 4.0, py::arg("optimism") = 1.0)
        .def_property_readonly("trials", &Calibrator::trials)
        .def(
            "choose",
            [](const Calibrator& cal, const std::vector<double>& conds, const std::vector<int32_t>& supports,
               const std::vector<int32_t>& parents, const std::vector<int32_t>& sources, int32_t match_len,
               int32_t prev, const std::vector<double>& costs, double rate, bool cost_aware,
               const std::vector<int32_t>& tokens, int32_t last_token, const std::vector<float>& backoff,
               const std::vector<int32_t>& recency, const std::vector<int32_t>& pair_recency) {
                FeatureView v;
                ListFeatures held(&v, conds, supports, parents, sources, tokens, backoff, recency, pair_recency,
                                  match_len, prev, last_token);
                auto [probs, keep] = choose_prefix(cal, v, costs, rate, cost_aware);
                return py::make_tuple(probs, keep);
            },
            py::arg("conds"), py::arg("supports"), py::arg("parents"), py::arg("sources"), py::arg("match_len"),
            py::arg("prev"), py::arg("costs"), py::arg("rate"), py::arg("cost_aware") = true,
            py::arg("tokens") = std::vector<int32_t>{}, py::arg("last_token") = -1,
            py::arg("backoff") = std::vector<float>{}, py::arg("recency") = std::vector<int32_t>{},
            py::arg("pair_recency") = std::vector<int32_t>{},
            "Cumulative acceptance estimates of a draft and the prefix length worth verifying.")
        .def(
            "observe",
            [](Calibrator& cal, const std::vector<double>& conds, const std::vector<int32_t>& supports,
               const std::vector<int32_t>& parents, const std::vector<int32_t>& sources, int32_t match_len,
               int32_t prev, const std::vector<bool>& hits, const std::vector<int32_t>& tokens, int32_t last_token,
               const std::vector<float>& backoff, const std::vector<int32_t>& recency,
               const std::vector<int32_t>& pair_recency, int64_t start) {
                FeatureView v;
                ListFeatures held(&v, conds, supports, parents, sources, tokens, backoff, recency, pair_recency,
                                  match_len, prev, last_token);
                if (hits.size() != v.n) throw py::value_error("draft feature lists differ in length");
                learn_prefix(cal, v, hits, start);
            },
            py::arg("conds"), py::arg("supports"), py::arg("parents"), py::arg("sources"), py::arg("match_len"),
            py::arg("prev"), py::arg("hits"), py::arg("tokens") = std::vector<int32_t>{}, py::arg("last_token") = -1,
            py::arg("backoff") = std::vector<float>{}, py::arg("recency") = std::vector<int32_t>{},
            py::arg("pair_recency") = std::vector<int32_t>{}, py::arg("start") = 0,
            "Learn from a verified draft: hits[i] = token i was accepted (tokens before start: "
            "already learned, their hits only say which later tokens were judged).")
        .def(
            "choose_draft",
            [](const Calibrator& cal, const NativeDraft& nd, int32_t prev, const std::vector<double>& costs,
               double rate, bool cost_aware, int32_t last_token) {
                auto [probs, keep] = choose_prefix(cal, nd.view(prev, last_token), costs, rate, cost_aware);
                probs.resize(keep);
                return py::make_tuple(probs, keep);
            },
            py::arg("draft"), py::arg("prev"), py::arg("costs"), py::arg("rate"), py::arg("cost_aware") = true,
            py::arg("last_token") = -1,
            "choose() for a NativeDraft: the kept prefix's cumulative estimates and its length.")
        .def(
            "observe_draft",
            [](Calibrator& cal, const NativeDraft& nd, int32_t prev, int32_t last_token, const std::vector<bool>& hits,
               int64_t start) { learn_prefix(cal, nd.view(prev, last_token), hits, start); },
            py::arg("draft"), py::arg("prev"), py::arg("last_token"), py::arg("hits"), py::arg("start") = 0,
            "observe() for a NativeDraft: learns its first len(hits) tokens (drafted, then declined "
            "candidates the text judged), but the first start.");

    py::class_<NativeDraft>(m, "NativeDraft",
                            "A speculate_multi draft with every candidate, kept native (see draft_multi).")
        .def("__len__", [](const NativeDraft& nd) { return nd.d.tokens.size(); })
        .def_property_readonly("match_len", [](const NativeDraft& nd) { return nd.match_len; })
        .def_property_readonly("probs", [](const NativeDraft& nd) { return nd.d.probs; })
        .def(
            "tokens",
            [](const NativeDraft& nd, size_t start) {
                start = std::min(start, nd.d.tokens.size());
                return std::vector<Token>(nd.d.tokens.begin() + static_cast<std::ptrdiff_t>(start), nd.d.tokens.end());
            },
            py::arg("start") = 0, "The candidate tokens from index start on.")
        .def(
            "head",
            [](const NativeDraft& nd, size_t k) {
                k = std::min(k, nd.d.tokens.size());
                const auto end = [k](const auto& v) { return v.begin() + static_cast<std::ptrdiff_t>(k); };
                py::object seq = k ? py::cast(nd.d.seq_ids[0]) : py::none();
                return py::make_tuple(std::vector<Token>(nd.d.tokens.begin(), end(nd.d.tokens)),
                                      std::vector<int32_t>(nd.d.parents.begin(), end(nd.d.parents)),
                                      std::vector<int32_t>(nd.d.sources.begin(), end(nd.d.sources)), seq);
            },
            py::arg("k"),
            "The first k tokens: (tokens, parents, source indices into the trees passed, "
            "a sequence holding the first token's path or None).");

    m.def(
        "speculate_multi",
        [](const py::list& trees, const std::vector<double>& weights, const std::vector<int64_t>& tail_seqs,
           const py::object& context, int max_tokens, double factor, double offset, double min_prob, int max_match,
           bool use_tree, double match_power) {
            MultiArgs a = multi_args(trees, weights, tail_seqs, context, max_tokens, factor, offset, min_prob,
                                     max_match, use_tree, match_power);
            Draft d;
            {
                py::gil_scoped_release release;
                d = speculate_multi(a.trees, weights, tail_seqs, a.context, a.params, match_power);
            }
            return draft_to_dict(std::move(d));
        },
        py::arg("trees"), py::arg("weights"), py::arg("tail_seqs"), py::arg("context"), py::arg("max_tokens") = 32,
        py::arg("max_spec_factor") = 1.0, py::arg("max_spec_offset") = 0.0, py::arg("min_token_prob") = 0.1,
        py::arg("max_match") = 0, py::arg("use_tree") = false, py::arg("match_power") = 1.0,
        "Draft from several trees at once (a mixture of their continuations).");

    m.def(
        "draft_multi",
        [](const py::list& trees, const std::vector<int32_t>& kinds, const std::vector<double>& weights,
           const std::vector<int64_t>& tail_seqs, const py::object& context, int max_tokens, double factor,
           double offset, double min_prob, int max_match, bool use_tree, double match_power) {
            if (kinds.size() != trees.size()) throw py::value_error("one source kind per tree");
            MultiArgs a = multi_args(trees, weights, tail_seqs, context, max_tokens, factor, offset, min_prob,
                                     max_match, use_tree, match_power);
            NativeDraft nd;
            {
                py::gil_scoped_release release;
                nd.d = speculate_multi(a.trees, weights, tail_seqs, a.context, a.params, match_power);
                const Draft& d = nd.d;
                const size_t n = d.tokens.size();
                nd.conds.resize(n);
                nd.kinds.resize(n);
                for (size_t i = 0; i < n; ++i) {
                    const int32_t p = d.parents[i];
                    nd.conds[i] = p >= 0 && d.probs[p] > 0.0 ? d.probs[i] / d.probs[p] : d.probs[i];
                    nd.kinds[i] = kinds[d.sources[i]];
                }
                for (int32_t m : d.match_lens) nd.match_len = std::max(nd.match_len, m);
            }
            return nd;
        },
        py::arg("trees"), py::arg("kinds"), py::arg("weights"), py::arg("tail_seqs"), py::arg("context"),
        py::arg("max_tokens") = 32, py::arg("max_spec_factor") = 1.0, py::arg("max_spec_offset") = 0.0,
        py::arg("min_token_prob") = 0.1, py::arg("max_match") = 0, py::arg("use_tree") = false,
        py::arg("match_power") = 1.0,
        "speculate_multi as a NativeDraft, for Calibrator.choose_draft/observe_draft; kinds: the "
        "calibrator's source id of each tree.");
}
