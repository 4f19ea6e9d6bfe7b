// A multi-sequence, depth-limited, path-compressed suffix tree over int32 token
// ids, with occurrence counts, built for drafting in speculative decoding.
//
// What it represents. For every live sequence s and every position e in s, and
// every length 1 <= L <= max_depth, the string w = s[e-L+1 .. e] is one
// *occurrence* of w. count(w) is the number of occurrences of w over all live
// sequences. The tree is a trie of every string with count > 0, compressed so
// that an edge is a chain of tokens along which the count does not change.
// Drafting follows the most frequent continuation: the probability of token x
// after w is count(w x) / count(w).
//
// Invariants (checked by check_integrity):
//   * count(child) <= count(parent); the root's count is unused.
//   * Every occurrence that ends where its sequence ends, or at depth
//     max_depth, ends exactly at a node boundary (never mid-edge). Consequence:
//     the "active" strings of a sequence being extended are always nodes, and
//     removal walks whole edges only.
//   * An edge label is stored as a reference into one sequence's tokens
//     (ref_seq, ref_end): tokens[ref_end - len, ref_end). A removed sequence's
//     tokens stay allocated while some node still references them (refs > 0).
//
// Complexity: extend costs O(max_depth) per appended token (one step per
// active suffix, each O(1) expected); remove costs O(length * edges per path);
// speculate costs O(match window * edge walk) plus O(draft size).
//
// Thread safety: none inside. A tree must not be used from two threads at once
// (speculate also updates the cached best child of a node). The Python layer
// serialises every call on a tree with one lock and releases the GIL inside.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace suffixcache {

using Token = int32_t;
using NodeId = int32_t;
constexpr NodeId kNoNode = -1;

struct Node {
    int32_t count = 0;            // occurrences of the string ending at this node
    NodeId parent = kNoNode;      // kNoNode for the root
    NodeId first_child = kNoNode; // intrusive, unordered list of children
    NodeId next_sibling = kNoNode;
    NodeId prev_sibling = kNoNode;
    NodeId best_child = kNoNode;  // cached most frequent child; kNoNode = recompute
    Token token = 0;              // first token of the edge (key in the parent)
    int32_t len = 0;              // tokens on the edge into this node
    int32_t depth = 0;            // length of the string from the root to this node's end
    int32_t ref_seq = -1;         // sequence slot holding the edge label
    int32_t ref_end = 0;          // edge label = slot tokens [ref_end - len, ref_end)
    // Only inside extend(): a leaf that grows with its sequence without being
    // touched per token; len, depth and ref_end lag behind by (sequence length -
    // ref_end) until materialise() catches them up. Never set between calls.
    bool open = false;
};

// Open-addressing map (parent, token) -> child, linear probing with
// backward-shift deletion: the children of every node that has more than one,
// in one flat table, so a node pays no per-node container overhead.
class ChildMap {
  public:
    ChildMap();
    NodeId find(NodeId parent, Token token) const;
    void insert(NodeId parent, Token token, NodeId child);  // key must be absent
    void assign(NodeId parent, Token token, NodeId child);  // key must be present
    void erase(NodeId parent, Token token);                 // key must be present
    size_t size() const { return size_; }
    size_t memory_bytes() const { return slots_.capacity() * sizeof(Slot); }

  private:
    struct Slot {
        uint64_t key;
        NodeId value;  // kNoNode = empty
    };
    static uint64_t make_key(NodeId parent, Token token) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) |
               static_cast<uint32_t>(token);
    }
    size_t slot_of(uint64_t key) const;
    void grow();
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

struct SpecParams {
    int max_tokens = 32;           // draft budget (tokens)
    double max_spec_factor = 1.0;  // path length <= factor * match_len + offset
    double max_spec_offset = 0.0;
    double min_token_prob = 0.1;   // stop below this cumulative probability
    int max_match = 0;             // longest suffix of the context to match; 0 = max_depth - 1
    bool use_tree = false;         // a tree of branches instead of one path
};

struct Draft {
    std::vector<Token> tokens;
    std::vector<int32_t> parents;  // index into tokens; -1 = hangs off the context
    std::vector<double> probs;     // cumulative probability along the token's path
    std::vector<int32_t> sources;  // index of the source that contributed most
    std::vector<int32_t> counts;   // occurrences supporting the token (max over sources)
    std::vector<int64_t> seq_ids;  // a sequence of the top source holding the token's path
    std::vector<int32_t> match_lens;  // per source: matched suffix length
    double score = 0.0;            // sum of probs: expected accepted tokens
    // speculate_multi only: per token, kBackoffOrders.size() backoff estimates (see
    // backoff_probs), row-major
    std::vector<float> backoff;
    // speculate_multi only: per token, how recently the transcript holding the context
    // used it (see recency_buckets); empty without such a transcript
    std::vector<int8_t> recency;
    // the same for the pair (token before it, token); see pair_recency_buckets
    std::vector<int8_t> pair_recency;
};

// The context lengths k of the backoff estimates (1..kNumBackoff: backoff_probs relies on it).
constexpr int kBackoffOrders[] = {1, 2, 3};
constexpr int kNumBackoff = 3;
// Only a draft's first tokens get them (-1 after): each costs a few lookups in every
// tree, and a CPU verifier's drafts are rarely kept further.
constexpr size_t kBackoffTokens = 6;

class SuffixTree {
  public:
    explicit SuffixTree(int max_depth = 64);

    // Appends tokens to sequence seq_id (created on first use).
    void extend(int64_t seq_id, const std::vector<Token>& tokens);
    // Forgets a sequence entirely; false if it is unknown.
    bool remove(int64_t seq_id);
    bool contains(int64_t seq_id) const { return seq_slots_.count(seq_id) != 0; }
    int64_t seq_length(int64_t seq_id) const;
    std::vector<Token> seq_tokens(int64_t seq_id) const;
    // A live sequence's tokens, without a copy; nullptr if unknown. Valid until the
    // tree changes.
    const std::vector<Token>* seq_tokens_ref(int64_t seq_id) const;
    std::vector<int64_t> seq_ids() const;

    Draft speculate(const std::vector<Token>& context, const SpecParams& params);

    // Occurrence count of a string (0 if absent or longer than max_depth).
    int64_t count(const std::vector<Token>& pattern) const;

    int max_depth() const { return max_depth_; }
    int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_nodes_.size()) - 1; }  // root excluded
    int64_t num_sequences() const { return static_cast<int64_t>(seq_slots_.size()); }
    int64_t num_tokens() const { return live_tokens_; }
    int64_t retained_tokens() const;  // tokens held, including removed sequences still referenced
    int64_t memory_bytes() const;
    // Throws std::logic_error describing the first violated invariant.
    void check_integrity() const;

    // --- used by the multi-source drafter ---
    struct Cursor {
        NodeId node = kNoNode;  // node whose edge holds the position
        int32_t offset = 0;     // tokens of that edge consumed (1..len); at node end when == len
    };
    // Longest suffix of context (at most max_match tokens) occurring at least min_count times.
    Cursor match(const Token* context, int64_t n, int max_match, int32_t min_count, int32_t* match_len) const;
    // True if sequence seq_id ends with tokens[0, n).
    bool ends_with(int64_t seq_id, const Token* tokens, int64_t n) const;
    Token edge_token(NodeId node, int32_t offset) const;  // token at 0-based offset on the edge
    const Node& node(NodeId id) const { return nodes_[id]; }
    // Id of the sequence a node's edge label points into (one occurrence of its string).
    int64_t ref_seq_id(NodeId id) const { return slots_[nodes_[id].ref_seq].id; }
    NodeId best_child(NodeId id);
    NodeId child(NodeId parent, Token token) const {
        // A node with one child (most of them: chains, fresh splits) answers from its
        // own child list; only nodes with several children are in the hash table.
        const NodeId first = nodes_[parent].first_child;
        if (first == kNoNode) return kNoNode;
        if (nodes_[first].next_sibling == kNoNode) return nodes_[first].token == token ? first : kNoNode;
        return children_.find(parent, token);
    }

  private:
    struct Seq {
        std::vector<Token> tokens;
        std::vector<NodeId> active;  // nodes of the suffixes ending at the last token, by length
        int64_t id = 0;
        int32_t refs = 0;  // nodes whose edge label points into tokens
        bool live = true;
    };

    NodeId new_node();
    void free_node(NodeId id);
    // Attach/detach a child: sibling list, and the hash table when the parent has several.
    void add_child(NodeId parent, NodeId child);
    void remove_child(NodeId child);
    void set_ref(NodeId id, int32_t slot, int32_t end);
    void release_slot_ref(int32_t slot);
    NodeId split_first(NodeId child);  // splits one token off the top of child's edge
    // One token of extend(); `open` holds the sequence's open leaves (longest last).
    void append_token(int32_t slot, Token token, std::vector<NodeId>& open);
    void materialise(NodeId id);

    int max_depth_;
    std::vector<Node> nodes_;
    std::vector<NodeId> free_nodes_;
    ChildMap children_;
    std::vector<Seq> slots_;
    std::vector<int32_t> free_slots_;
    std::unordered_map<int64_t, int32_t> seq_slots_;
    int64_t live_tokens_ = 0;
};

// Drafts from several trees at once: a mixture of their continuation
// distributions, each weighted by weights[i] * (its match length)^match_power,
// re-weighted along a path by how well each source predicted it (Bayes).
// tail_seqs[i] (or -1) names a sequence of tree i that may end with the context
// itself (a session transcript that already holds the context): that trailing
// occurrence predicts nothing, so it is excluded from matching and counts.
// Fills draft.backoff and draft.recency as well (see backoff_probs, recency_buckets;
// the transcript is tail_seqs' sequence that ends with the context, if any).
Draft speculate_multi(const std::vector<SuffixTree*>& trees, const std::vector<double>& weights,
                      const std::vector<int64_t>& tail_seqs, const std::vector<Token>& context,
                      const SpecParams& params, double match_power);

// How predictable each draft token is from the few tokens before it alone, whatever
// the longer context: for k in kBackoffOrders, count(w token) / (count(w) + 1) with
// counts summed over the trees, w = the k tokens before the token (the context, then
// the draft's path to it). A long match seen once predicts its continuation with
// probability 1; whether a short context is usually continued that way tells a
// reliable continuation from a guess (the calibrator learns how much to trust each).
// Returns tokens.size() * kNumBackoff values, row-major; -1 where the context and
// path hold fewer than k tokens, and for the tokens after the first kBackoffTokens.
std::vector<float> backoff_probs(const std::vector<SuffixTree*>& trees, const std::vector<Token>& context,
                                 const std::vector<Token>& tokens, const std::vector<int32_t>& parents);

// The windows of recency_buckets: the last 32, 128 and 512 tokens of a transcript.
constexpr int kRecencyWindows[] = {32, 128, 512};
// For each token, the smallest window at the end of the transcript that holds it (0,
// 1, 2), or 3 if none does. A token the conversation used recently (a column name of
// the schema in the prompt, an identifier of the code at hand) is a likelier
// continuation than one a long match brings from elsewhere.
std::vector<int8_t> recency_buckets(const std::vector<Token>& transcript, const std::vector<Token>& tokens);
// The same for each draft token's pair (the token before it, the token): the token
// before it is its parent's, or the transcript's last for the first ones. A recent
// pair says the conversation is repeating itself right there.
std::vector<int8_t> pair_recency_buckets(const std::vector<Token>& transcript, const std::vector<Token>& tokens,
                                         const std::vector<int32_t>& parents);

}  // namespace suffixcache
