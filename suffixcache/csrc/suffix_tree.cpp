#include "suffix_tree.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <queue>
#include <sstream>

namespace suffixcache {

namespace {
constexpr NodeId kRoot = 0;

inline uint64_t mix(uint64_t x) {
    // splitmix64 finaliser: child keys are highly structured (parent ids are dense).
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

[[noreturn]] void fail(const std::string& what) { throw std::logic_error("suffix tree integrity: " + what); }
}  // namespace

// ---------------------------------------------------------------- ChildMap

ChildMap::ChildMap() : slots_(16, Slot{0, kNoNode}), mask_(15) {}

size_t ChildMap::slot_of(uint64_t key) const {
    size_t i = mix(key) & mask_;
    while (slots_[i].value != kNoNode && slots_[i].key != key) i = (i + 1) & mask_;
    return i;
}

NodeId ChildMap::find(NodeId parent, Token token) const {
    return slots_[slot_of(make_key(parent, token))].value;
}

void ChildMap::insert(NodeId parent, Token token, NodeId child) {
    if ((size_ + 1) * 10 > slots_.size() * 7) grow();
    uint64_t key = make_key(parent, token);
    size_t i = slot_of(key);
    slots_[i] = Slot{key, child};
    ++size_;
}

void ChildMap::assign(NodeId parent, Token token, NodeId child) {
    slots_[slot_of(make_key(parent, token))].value = child;
}

void ChildMap::erase(NodeId parent, Token token) {
    size_t i = slot_of(make_key(parent, token));
    if (slots_[i].value == kNoNode) return;
    // Backward-shift deletion keeps probe sequences intact without tombstones.
    size_t j = i;
    while (true) {
        j = (j + 1) & mask_;
        if (slots_[j].value == kNoNode) break;
        size_t home = mix(slots_[j].key) & mask_;
        bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            slots_[i] = slots_[j];
            i = j;
        }
    }
    slots_[i].value = kNoNode;
    --size_;
}

void ChildMap::grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{0, kNoNode});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
        if (s.value == kNoNode) continue;
        size_t i = mix(s.key) & mask_;
        while (slots_[i].value != kNoNode) i = (i + 1) & mask_;
        slots_[i] = s;
    }
}

// ---------------------------------------------------------------- SuffixTree

SuffixTree::SuffixTree(int max_depth) : max_depth_(max_depth) {
    if (max_depth < 1 || max_depth > 4096) throw std::invalid_argument("max_depth must be in [1, 4096]");
    nodes_.emplace_back();  // the root
}

NodeId SuffixTree::new_node() {
    if (!free_nodes_.empty()) {
        NodeId id = free_nodes_.back();
        free_nodes_.pop_back();
        nodes_[id] = Node{};
        return id;
    }
    if (nodes_.size() >= static_cast<size_t>(INT32_MAX)) throw std::length_error("suffix tree node limit reached");
    nodes_.emplace_back();
    return static_cast<NodeId>(nodes_.size() - 1);
}

void SuffixTree::free_node(NodeId id) {
    release_slot_ref(nodes_[id].ref_seq);
    nodes_[id] = Node{};
    nodes_[id].count = -1;  // marks a free node for check_integrity
    free_nodes_.push_back(id);
}

void SuffixTree::add_child(NodeId parent, NodeId child) {
    Node& p = nodes_[parent];
    const NodeId first = p.first_child;
    if (first != kNoNode) {
        // From one child to two: the first one enters the table too.
        if (nodes_[first].next_sibling == kNoNode) children_.insert(parent, nodes_[first].token, first);
        children_.insert(parent, nodes_[child].token, child);
    }
    Node& c = nodes_[child];
    c.parent = parent;
    c.prev_sibling = kNoNode;
    c.next_sibling = first;
    if (first != kNoNode) nodes_[first].prev_sibling = child;
    p.first_child = child;
}

void SuffixTree::remove_child(NodeId child) {
    Node& c = nodes_[child];
    const NodeId parent = c.parent;
    Node& p = nodes_[parent];
    const bool several = nodes_[p.first_child].next_sibling != kNoNode;
    if (several) children_.erase(parent, c.token);
    if (c.prev_sibling != kNoNode)
        nodes_[c.prev_sibling].next_sibling = c.next_sibling;
    else
        p.first_child = c.next_sibling;
    if (c.next_sibling != kNoNode) nodes_[c.next_sibling].prev_sibling = c.prev_sibling;
    if (p.best_child == child) p.best_child = kNoNode;
    c.prev_sibling = c.next_sibling = kNoNode;
    // From two children to one: the survivor leaves the table.
    if (several && nodes_[p.first_child].next_sibling == kNoNode) children_.erase(parent, nodes_[p.first_child].token);
}

void SuffixTree::set_ref(NodeId id, int32_t slot, int32_t end) {
    Node& n = nodes_[id];
    int32_t old = n.ref_seq;
    n.ref_seq = slot;
    n.ref_end = end;
    ++slots_[slot].refs;
    if (old >= 0) release_slot_ref(old);
}

void SuffixTree::release_slot_ref(int32_t slot) {
    if (slot < 0) return;
    Seq& s = slots_[slot];
    if (--s.refs == 0 && !s.live) {
        s.tokens = std::vector<Token>();
        free_slots_.push_back(slot);
    }
}

namespace {
inline bool better(const Node& a, const Node& b) {
    return a.count > b.count || (a.count == b.count && a.token < b.token);
}
}  // namespace

NodeId SuffixTree::best_child(NodeId id) {
    Node& n = nodes_[id];
    if (n.best_child == kNoNode && n.first_child != kNoNode) {
        NodeId best = n.first_child;
        for (NodeId c = nodes_[best].next_sibling; c != kNoNode; c = nodes_[c].next_sibling)
            if (better(nodes_[c], nodes_[best])) best = c;
        n.best_child = best;
    }
    return n.best_child;
}

NodeId SuffixTree::split_first(NodeId child) {
    NodeId mid = new_node();
    Node& c = nodes_[child];
    Node& m = nodes_[mid];
    NodeId parent = c.parent;
    m.count = c.count;
    m.token = c.token;
    m.len = 1;
    m.depth = c.depth - c.len + 1;
    m.parent = parent;
    int32_t slot = c.ref_seq;
    int32_t mid_end = c.ref_end - c.len + 1;
    // mid takes child's place among the parent's children.
    m.prev_sibling = c.prev_sibling;
    m.next_sibling = c.next_sibling;
    if (c.prev_sibling != kNoNode)
        nodes_[c.prev_sibling].next_sibling = mid;
    else
        nodes_[parent].first_child = mid;
    if (c.next_sibling != kNoNode) nodes_[c.next_sibling].prev_sibling = mid;
    if (nodes_[parent].best_child == child) nodes_[parent].best_child = mid;
    if (nodes_[parent].first_child != mid || m.next_sibling != kNoNode) children_.assign(parent, c.token, mid);
    c.len -= 1;
    c.token = slots_[slot].tokens[mid_end];
    c.prev_sibling = c.next_sibling = kNoNode;
    c.parent = mid;
    m.first_child = child;  // mid's only child: not in the table
    m.best_child = child;
    set_ref(mid, slot, mid_end);
    return mid;
}

void SuffixTree::materialise(NodeId id) {
    Node& n = nodes_[id];
    if (!n.open) return;
    const int32_t delta = static_cast<int32_t>(slots_[n.ref_seq].tokens.size()) - n.ref_end;
    n.len += delta;
    n.depth += delta;
    n.ref_end += delta;
}

// Appends one token to sequence `slot`: every suffix ending at the previous
// token (its "active" nodes, shortest first) is extended by it. Suffixes that
// run through text nobody else shares end in leaves of count 1 that grow with
// the sequence; those are kept "open" (see Node::open) and cost nothing per
// token, so the work per token is the number of suffixes still inside shared
// structure, not max_depth.
void SuffixTree::append_token(int32_t slot, Token token, std::vector<NodeId>& open) {
    // Index, not reference: new_node() may reallocate nodes_, and only slot's
    // own vector grows here.
    const int32_t n = static_cast<int32_t>(slots_[slot].tokens.size());
    slots_[slot].tokens.push_back(token);
    std::vector<NodeId> next;
    next.reserve(slots_[slot].active.size() + 1);
    next.push_back(kRoot);
    size_t newly_open = 0;
    for (NodeId a : slots_[slot].active) {
        NodeId result;
        Node& an = nodes_[a];
        if (a != kRoot && an.first_child == kNoNode && an.count == 1) {
            // The only occurrence of this leaf is ours and it ends at our last
            // token: from now on it grows with the sequence (and so do all
            // longer suffixes, which are leaves of count 1 too).
            if (an.ref_seq != slot) set_ref(a, slot, n);
            nodes_[a].open = true;
            open.insert(open.begin() + static_cast<std::ptrdiff_t>(newly_open++), a);
            continue;
        }
        NodeId only = kNoNode;  // a's only child, if it has exactly one
        if (a != kRoot && an.first_child != kNoNode && nodes_[an.first_child].next_sibling == kNoNode) {
            only = an.first_child;
            materialise(only);
        }
        if (only != kNoNode && nodes_[only].token == token && an.count == nodes_[only].count + 1 &&
            nodes_[only].len > 1) {
            // Our occurrence is the only one ending at a (count = child's + 1) and it
            // continues into a's only child: move a's end one token down that edge
            // instead of splitting it, which would leave a chain of one-token nodes
            // with equal counts behind every shared stretch.
            Node& an2 = nodes_[a];
            NodeId c = an2.first_child;
            Node& cn = nodes_[c];
            const int32_t slot_c = cn.ref_seq;
            const int32_t new_end = cn.ref_end - cn.len + 1;
            cn.len -= 1;
            cn.token = slots_[slot_c].tokens[new_end];  // c is a's only child: not in the table
            set_ref(a, slot_c, new_end);
            Node& grown = nodes_[a];
            grown.len += 1;
            grown.depth += 1;
            result = a;
        } else {
            NodeId c = child(a, token);
            if (c == kNoNode) {
                c = new_node();
                Node& cn = nodes_[c];
                cn.count = 1;
                cn.token = token;
                cn.len = 1;
                cn.depth = nodes_[a].depth + 1;
                add_child(a, c);
                set_ref(c, slot, n + 1);
            } else {
                materialise(c);
                if (nodes_[c].len > 1) c = split_first(c);
                nodes_[c].count += 1;
            }
            Node& pa = nodes_[a];
            if (pa.best_child != kNoNode && pa.best_child != c && better(nodes_[c], nodes_[pa.best_child]))
                pa.best_child = c;
            result = c;
        }
        if (nodes_[result].depth < max_depth_) next.push_back(result);
    }
    // The longest open leaf may now reach max_depth: it stops growing.
    if (!open.empty()) {
        NodeId longest = open.back();
        materialise(longest);
        if (nodes_[longest].depth >= max_depth_) {
            nodes_[longest].open = false;
            open.pop_back();
        }
    }
    slots_[slot].active.swap(next);
}

void SuffixTree::extend(int64_t seq_id, const std::vector<Token>& tokens) {
    for (Token t : tokens)
        if (t < 0) throw std::invalid_argument("token ids must be >= 0, got " + std::to_string(t));
    int32_t slot;
    auto it = seq_slots_.find(seq_id);
    if (it == seq_slots_.end()) {
        if (!free_slots_.empty()) {
            slot = free_slots_.back();
            free_slots_.pop_back();
            slots_[slot] = Seq{};
        } else {
            slots_.emplace_back();
            slot = static_cast<int32_t>(slots_.size() - 1);
        }
        slots_[slot].id = seq_id;
        slots_[slot].active.push_back(kRoot);
        seq_slots_.emplace(seq_id, slot);
    } else {
        slot = it->second;
    }
    if (slots_[slot].tokens.size() + tokens.size() >= static_cast<size_t>(INT32_MAX))
        throw std::length_error("sequence too long");
    slots_[slot].tokens.reserve(slots_[slot].tokens.size() + tokens.size());
    std::vector<NodeId> open;
    for (Token t : tokens) append_token(slot, t, open);
    // Between calls every node is explicit: catch the open leaves up and hand
    // them back to the active list (they are its longest suffixes).
    std::vector<NodeId>& active = slots_[slot].active;
    for (NodeId leaf : open) {
        materialise(leaf);
        nodes_[leaf].open = false;
        active.push_back(leaf);
    }
    live_tokens_ += static_cast<int64_t>(tokens.size());
}

bool SuffixTree::remove(int64_t seq_id) {
    auto it = seq_slots_.find(seq_id);
    if (it == seq_slots_.end()) return false;
    const int32_t slot = it->second;
    seq_slots_.erase(it);
    // Keep the slot alive (refs + 1) while we walk its own tokens.
    ++slots_[slot].refs;
    slots_[slot].live = false;
    slots_[slot].active.clear();
    const int64_t n = static_cast<int64_t>(slots_[slot].tokens.size());
    std::vector<NodeId> path;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t end = std::min<int64_t>(i + max_depth_, n);
        path.clear();
        NodeId cur = kRoot;
        int64_t pos = i;
        while (pos < end) {
            NodeId c = child(cur, slots_[slot].tokens[pos]);
            if (c == kNoNode) fail("remove: occurrence path missing");
            pos += nodes_[c].len;
            path.push_back(c);
            cur = c;
        }
        if (pos != end) fail("remove: occurrence ends mid-edge");
        for (auto p = path.rbegin(); p != path.rend(); ++p) {
            NodeId c = *p;
            Node& cn = nodes_[c];
            cn.count -= 1;
            NodeId parent = cn.parent;
            if (nodes_[parent].best_child == c) nodes_[parent].best_child = kNoNode;
            if (cn.count == 0) {
                if (cn.first_child != kNoNode) fail("remove: node with count 0 has children");
                remove_child(c);
                free_node(c);
            }
        }
    }
    live_tokens_ -= n;
    release_slot_ref(slot);
    return true;
}

int64_t SuffixTree::seq_length(int64_t seq_id) const {
    auto it = seq_slots_.find(seq_id);
    if (it == seq_slots_.end()) return -1;
    return static_cast<int64_t>(slots_[it->second].tokens.size());
}

const std::vector<Token>* SuffixTree::seq_tokens_ref(int64_t seq_id) const {
    auto it = seq_slots_.find(seq_id);
    return it == seq_slots_.end() ? nullptr : &slots_[it->second].tokens;
}

std::vector<Token> SuffixTree::seq_tokens(int64_t seq_id) const {
    auto it = seq_slots_.find(seq_id);
    if (it == seq_slots_.end()) throw std::out_of_range("unknown sequence " + std::to_string(seq_id));
    return slots_[it->second].tokens;
}

std::vector<int64_t> SuffixTree::seq_ids() const {
    std::vector<int64_t> ids;
    ids.reserve(seq_slots_.size());
    for (const auto& kv : seq_slots_) ids.push_back(kv.first);
    std::sort(ids.begin(), ids.end());
    return ids;
}

Token SuffixTree::edge_token(NodeId node, int32_t offset) const {
    const Node& n = nodes_[node];
    return slots_[n.ref_seq].tokens[n.ref_end - n.len + offset];
}

int64_t SuffixTree::count(const std::vector<Token>& pattern) const {
    if (pattern.empty() || static_cast<int64_t>(pattern.size()) > max_depth_) return 0;
    NodeId cur = kRoot;
    int32_t off = 0;
    for (Token t : pattern) {
        if (off == nodes_[cur].len) {
            NodeId c = child(cur, t);
            if (c == kNoNode) return 0;
            cur = c;
            off = 1;
        } else {
            if (edge_token(cur, off) != t) return 0;
            ++off;
        }
    }
    return nodes_[cur].count;
}

bool SuffixTree::ends_with(int64_t seq_id, const Token* tokens, int64_t n) const {
    auto it = seq_slots_.find(seq_id);
    if (it == seq_slots_.end()) return false;
    const std::vector<Token>& seq = slots_[it->second].tokens;
    if (static_cast<int64_t>(seq.size()) < n) return false;
    return std::equal(tokens, tokens + n, seq.end() - n);
}

SuffixTree::Cursor SuffixTree::match(const Token* context, int64_t n, int max_match, int32_t min_count,
                                     int32_t* match_len) const {
    int64_t window = std::min<int64_t>(n, max_match);
    for (int64_t start = n - window; start < n; ++start) {
        NodeId cur = kRoot;
        int32_t off = 0;
        int64_t pos = start;
        for (; pos < n; ++pos) {
            const Token t = context[pos];
            if (off == nodes_[cur].len) {
                NodeId c = child(cur, t);
                if (c == kNoNode) break;
                cur = c;
                off = 1;
            } else {
                if (edge_token(cur, off) != t) break;
                ++off;
            }
        }
        if (pos == n && nodes_[cur].count >= min_count) {
            *match_len = static_cast<int32_t>(n - start);
            return Cursor{cur, off};
        }
    }
    *match_len = 0;
    return Cursor{kRoot, 0};
}

int64_t SuffixTree::retained_tokens() const {
    int64_t total = 0;
    for (const Seq& s : slots_) total += static_cast<int64_t>(s.tokens.size());
    return total;
}

int64_t SuffixTree::memory_bytes() const {
    int64_t bytes = static_cast<int64_t>(nodes_.capacity() * sizeof(Node) + free_nodes_.capacity() * sizeof(NodeId) +
                                         children_.memory_bytes() + slots_.capacity() * sizeof(Seq) +
                                         free_slots_.capacity() * sizeof(int32_t));
    for (const Seq& s : slots_)
        bytes += static_cast<int64_t>(s.tokens.capacity() * sizeof(Token) + s.active.capacity() * sizeof(NodeId));
    // unordered_map: one heap node per entry plus the bucket array.
    bytes += static_cast<int64_t>(seq_slots_.size() * (sizeof(int64_t) + sizeof(int32_t) + 2 * sizeof(void*)) +
                                  seq_slots_.bucket_count() * sizeof(void*));
    return bytes;
}

void SuffixTree::check_integrity() const {
    std::vector<int32_t> refs(slots_.size(), 0);
    int64_t indexed = 0;  // nodes whose parent has several children (the hash table's entries)
    int64_t root_sum = 0;
    for (NodeId id = 0; id < static_cast<NodeId>(nodes_.size()); ++id) {
        const Node& n = nodes_[id];
        if (id != kRoot && n.count < 0) continue;  // free
        if (id != kRoot) {
            std::ostringstream where;
            where << "node " << id << ": ";
            if (n.count < 1) fail(where.str() + "count < 1");
            if (n.parent == kNoNode) fail(where.str() + "no parent");
            const Node& p = nodes_[n.parent];
            if (n.parent != kRoot && n.count > p.count) fail(where.str() + "count exceeds parent's");
            if (n.parent == kRoot) root_sum += n.count;
            if (n.len < 1) fail(where.str() + "empty edge");
            if (n.depth != p.depth + n.len) fail(where.str() + "depth != parent depth + len");
            if (n.depth > max_depth_) fail(where.str() + "deeper than max_depth");
            if (n.ref_seq < 0 || n.ref_seq >= static_cast<int32_t>(slots_.size())) fail(where.str() + "bad ref");
            const Seq& s = slots_[n.ref_seq];
            if (n.ref_end > static_cast<int32_t>(s.tokens.size()) || n.ref_end - n.len < 0)
                fail(where.str() + "ref out of range");
            ++refs[n.ref_seq];
            if (edge_token(id, 0) != n.token) fail(where.str() + "token differs from edge label");
            if (child(n.parent, n.token) != id) fail(where.str() + "child lookup disagrees");
            const NodeId first = p.first_child;
            if (nodes_[first].next_sibling != kNoNode) {
                ++indexed;
                if (children_.find(n.parent, n.token) != id) fail(where.str() + "child map disagrees");
            }
            if (n.open) fail(where.str() + "left open after extend");
        }
        int64_t kids = 0;
        NodeId prev = kNoNode;
        for (NodeId c = n.first_child; c != kNoNode; c = nodes_[c].next_sibling) {
            if (nodes_[c].parent != id) fail("sibling list holds a foreign node");
            if (nodes_[c].prev_sibling != prev) fail("broken prev_sibling link");
            prev = c;
            if (++kids > static_cast<int64_t>(nodes_.size())) fail("sibling cycle");
        }
        if (n.best_child != kNoNode && nodes_[n.best_child].parent != id) fail("stale best_child");
    }
    if (root_sum != live_tokens_) fail("root children counts do not add up to the live tokens");
    if (static_cast<int64_t>(children_.size()) != indexed)
        fail("child map holds entries beyond the children of nodes with several");
    for (size_t s = 0; s < slots_.size(); ++s)
        if (refs[s] != slots_[s].refs) fail("reference count of a sequence slot is wrong");
    for (const auto& kv : seq_slots_) {
        const Seq& s = slots_[kv.second];
        for (NodeId a : s.active) {
            if (a != kRoot && nodes_[a].count < 1) fail("active node was freed");
        }
    }
}

Draft SuffixTree::speculate(const std::vector<Token>& context, const SpecParams& params) {
    std::vector<SuffixTree*> trees{this};
    std::vector<double> weights{1.0};
    std::vector<int64_t> tails{-1};
    return speculate_multi(trees, weights, tails, context, params, 0.0);
}

// ---------------------------------------------------------------- drafting

namespace {

struct SourceState {
    SuffixTree::Cursor cursor;
    double prob = 0.0;      // probability of the path so far under this source
    int32_t discount = 0;   // occurrences of the cursor's string that predict nothing (the context's own tail)
};

struct DraftNode {
    int32_t parent;
    int32_t depth;  // tokens from the context end, 1-based
    std::vector<SourceState> states;  // one per source; prob 0 = source left the path
};

struct Candidate {
    double prob;
    int32_t parent;  // draft index or -1
    Token token;
    // Higher probability first; ties go to the earlier parent, then the smaller token,
    // so that drafts are deterministic.
    bool operator<(const Candidate& o) const {
        if (prob != o.prob) return prob < o.prob;
        if (parent != o.parent) return parent > o.parent;
        return token > o.token;
    }
};

// Next-token probabilities of one source from a cursor, appended as (token, conditional prob, cursor).
void next_tokens(SuffixTree* tree, const SourceState& state, bool all_children,
                 std::vector<std::pair<Token, std::pair<double, SuffixTree::Cursor>>>& out) {
    const SuffixTree::Cursor& cur = state.cursor;
    const Node& n = tree->node(cur.node);
    if (cur.offset < n.len) {
        out.push_back({tree->edge_token(cur.node, cur.offset), {1.0, SuffixTree::Cursor{cur.node, cur.offset + 1}}});
        return;
    }
    if (n.depth >= tree->max_depth() || n.count - state.discount <= 0) return;
    const double total = static_cast<double>(n.count - state.discount);
    if (!all_children) {
        NodeId b = tree->best_child(cur.node);
        if (b != kNoNode) out.push_back({tree->node(b).token, {tree->node(b).count / total, SuffixTree::Cursor{b, 1}}});
        return;
    }
    for (NodeId c = n.first_child; c != kNoNode; c = tree->node(c).next_sibling)
        out.push_back({tree->node(c).token, {tree->node(c).count / total, SuffixTree::Cursor{c, 1}}});
}

// Advances one source's cursor by token, or returns false if the source does not continue with it.
bool step(SuffixTree* tree, const SourceState& state, Token token, SuffixTree::Cursor* next, double* cond) {
    const SuffixTree::Cursor& cur = state.cursor;
    const Node& n = tree->node(cur.node);
    if (cur.offset < n.len) {
        if (tree->edge_token(cur.node, cur.offset) != token) return false;
        *next = SuffixTree::Cursor{cur.node, cur.offset + 1};
        *cond = 1.0;
        return true;
    }
    if (n.depth >= tree->max_depth() || n.count - state.discount <= 0) return false;
    NodeId c = tree->child(cur.node, token);
    if (c == kNoNode) return false;
    *next = SuffixTree::Cursor{c, 1};
    *cond = tree->node(c).count / static_cast<double>(n.count - state.discount);
    return true;
}

// The mixture draft itself (speculate_multi adds the per-token features).
Draft speculate_mixture(const std::vector<SuffixTree*>& trees, const std::vector<double>& weights,
                        const std::vector<int64_t>& tail_seqs, const std::vector<Token>& context,
                        const SpecParams& params, double match_power) {
    const size_t ns = trees.size();
    Draft draft;
    draft.match_lens.assign(ns, 0);
    if (ns == 0 || params.max_tokens <= 0 || context.empty()) return draft;

    // Prior weight of each source: its configured weight times a power of its
    // match length (a longer matched context predicts better).
    DraftNode root{-1, 0, std::vector<SourceState>(ns)};
    std::vector<double> prior(ns, 0.0);
    double z = 0.0;
    int32_t best_match = 0;
    for (size_t s = 0; s < ns; ++s) {
        int max_match = params.max_match > 0 ? params.max_match : trees[s]->max_depth() - 1;
        const int64_t n = static_cast<int64_t>(context.size());
        const int64_t window = std::min<int64_t>(n, max_match);
        const int32_t discount =
            (tail_seqs[s] >= 0 && trees[s]->ends_with(tail_seqs[s], context.data() + n - window, window)) ? 1 : 0;
        int32_t m = 0;
        SuffixTree::Cursor cur = trees[s]->match(context.data(), n, max_match, 1 + discount, &m);
        draft.match_lens[s] = m;
        if (m <= 0 || weights[s] <= 0.0) continue;
        prior[s] = weights[s] * std::pow(static_cast<double>(m), match_power);
        root.states[s] = SourceState{cur, 1.0, discount};
        z += prior[s];
        best_match = std::max(best_match, m);
    }
    if (z <= 0.0) return draft;
    const double limit_f = params.max_spec_factor * best_match + params.max_spec_offset;
    const int max_len = static_cast<int>(std::min<double>(params.max_tokens, std::floor(limit_f + 1e-9)));
    if (max_len <= 0) return draft;

    std::vector<DraftNode> nodes;  // index = draft index
    nodes.reserve(params.max_tokens);
    std::vector<std::pair<Token, std::pair<double, SuffixTree::Cursor>>> nexts;
    std::vector<Token> cand_tokens;

    // Expands a draft node: every token some source proposes, with its mixture probability.
    auto expand = [&](const DraftNode& from, int32_t from_index, bool all_children,
                      std::priority_queue<Candidate>* queue, Candidate* best) {
        if (from.depth >= max_len) return;
        cand_tokens.clear();
        for (size_t s = 0; s < ns; ++s) {
            if (from.states[s].prob <= 0.0) continue;
            nexts.clear();
            next_tokens(trees[s], from.states[s], all_children, nexts);
            for (auto& e : nexts) cand_tokens.push_back(e.first);
        }
        std::sort(cand_tokens.begin(), cand_tokens.end());
        cand_tokens.erase(std::unique(cand_tokens.begin(), cand_tokens.end()), cand_tokens.end());
        for (Token t : cand_tokens) {
            double p = 0.0;
            for (size_t s = 0; s < ns; ++s) {
                if (from.states[s].prob <= 0.0) continue;
                SuffixTree::Cursor nc;
                double cond;
                if (step(trees[s], from.states[s], t, &nc, &cond)) p += prior[s] * from.states[s].prob * cond;
            }
            p /= z;
            if (p < params.min_token_prob) continue;
            Candidate c{p, from_index, t};
            if (queue)
                queue->push(c);
            else if (best->parent == -2 || *best < c)
                *best = c;
        }
    };

    auto materialise = [&](const Candidate& c) {
        const DraftNode& from = c.parent < 0 ? root : nodes[c.parent];
        DraftNode dn{c.parent, from.depth + 1, std::vector<SourceState>(ns)};
        double top = -1.0;
        int32_t top_src = 0;
        int32_t support = 0;
        int64_t top_seq = -1;
        for (size_t s = 0; s < ns; ++s) {
            if (from.states[s].prob <= 0.0) continue;
            SuffixTree::Cursor nc;
            double cond;
            if (step(trees[s], from.states[s], c.token, &nc, &cond)) {
                dn.states[s] = SourceState{nc, from.states[s].prob * cond};
                support = std::max(support, trees[s]->node(nc.node).count);
                double contrib = prior[s] * dn.states[s].prob;
                if (contrib > top) {
                    top = contrib;
                    top_src = static_cast<int32_t>(s);
                    top_seq = trees[s]->ref_seq_id(nc.node);
                }
            }
        }
        nodes.push_back(std::move(dn));
        draft.tokens.push_back(c.token);
        draft.parents.push_back(c.parent);
        draft.probs.push_back(c.prob);
        draft.sources.push_back(top_src);
        draft.counts.push_back(support);
        draft.seq_ids.push_back(top_seq);
        draft.score += c.prob;
    };

    if (!params.use_tree) {
        int32_t at = -1;
        while (static_cast<int>(draft.tokens.size()) < max_len) {
            Candidate best{-1.0, -2, 0};
            expand(at < 0 ? root : nodes[at], at, false, nullptr, &best);
            if (best.parent == -2) break;
            materialise(best);
            at = static_cast<int32_t>(nodes.size() - 1);
        }
        return draft;
    }

    std::priority_queue<Candidate> queue;
    expand(root, -1, true, &queue, nullptr);
    while (!queue.empty() && static_cast<int>(draft.tokens.size()) < params.max_tokens) {
        Candidate c = queue.top();
        queue.pop();
        materialise(c);
        int32_t idx = static_cast<int32_t>(nodes.size() - 1);
        expand(nodes[idx], idx, true, &queue, nullptr);
    }
    return draft;
}

}  // namespace

namespace {
// One token further down from a position (the root: {kRoot, 0}); node kNoNode = absent.
SuffixTree::Cursor step_down(const SuffixTree& t, SuffixTree::Cursor at, Token token) {
    if (at.node == kNoNode) return at;
    if (at.offset == t.node(at.node).len) {
        const NodeId c = t.child(at.node, token);
        return {c, 1};
    }
    if (t.edge_token(at.node, at.offset) == token) return {at.node, at.offset + 1};
    return {kNoNode, 0};
}
int64_t count_at(const SuffixTree& t, SuffixTree::Cursor at) { return at.node == kNoNode ? 0 : t.node(at.node).count; }
}  // namespace

std::vector<float> backoff_probs(const std::vector<SuffixTree*>& trees, const std::vector<Token>& context,
                                 const std::vector<Token>& tokens, const std::vector<int32_t>& parents) {
    // The orders are 1..kNumBackoff: each token's strings of the last j tokens (j = 1..3)
    // extend its parent's (j - 1) by one step, so the counts cost one step per order.
    static_assert(kBackoffOrders[0] == 1 && kBackoffOrders[kNumBackoff - 1] == kNumBackoff, "orders 1..n");
    constexpr int K = kNumBackoff;
    const size_t nt = trees.size(), n = std::min<size_t>(tokens.size(), kBackoffTokens);
    std::vector<float> out(tokens.size() * K, -1.0f);
    if (n == 0) return out;
    // at[(i + 1) * nt + s][j - 1]: in tree s, the string of the j tokens ending at draft
    // token i (row 0: at the context's end)
    std::vector<std::array<SuffixTree::Cursor, K>> at((n + 1) * nt);
    const SuffixTree::Cursor root{kRoot, 0};
    const int64_t nc = static_cast<int64_t>(context.size());
    for (size_t s = 0; s < nt; ++s) {
        for (int j = 1; j <= K; ++j) {
            SuffixTree::Cursor c = j <= nc ? root : SuffixTree::Cursor{kNoNode, 0};
            for (int64_t q = nc - j; q < nc && c.node != kNoNode; ++q) c = step_down(*trees[s], c, context[q]);
            at[s][j - 1] = c;
        }
    }
    // how many tokens precede each draft token (capped at K): the context's, then its path's
    std::vector<int32_t> have(n);
    for (size_t i = 0; i < n; ++i) {
        const int32_t p = parents[i];
        const int32_t before = p < 0 ? static_cast<int32_t>(std::min<int64_t>(nc, K)) : std::min(have[p] + 1, K);
        have[i] = before;
        const size_t from = static_cast<size_t>(p + 1) * nt, to = (i + 1) * nt;
        int64_t total[K] = {}, next[K] = {};
        for (size_t s = 0; s < nt; ++s) {
            const auto& prev = at[from + s];
            auto& cur = at[to + s];
            const SuffixTree& t = *trees[s];
            const SuffixTree::Cursor one = step_down(t, root, tokens[i]);
            SuffixTree::Cursor longer[K];  // the strings of j + 1 tokens ending at token i
            for (int j = 0; j < K; ++j) {
                longer[j] = step_down(t, prev[j], tokens[i]);
                total[j] += count_at(t, prev[j]);
                next[j] += count_at(t, longer[j]);
            }
            cur[0] = one;
            for (int j = 1; j < K; ++j) cur[j] = longer[j - 1];
        }
        for (int j = 0; j < K && j < before; ++j)
            out[i * K + j] = static_cast<float>(static_cast<double>(next[j]) / static_cast<double>(total[j] + 1));
    }
    return out;
}

namespace {
constexpr int kRecencyBuckets = sizeof(kRecencyWindows) / sizeof(kRecencyWindows[0]);

// For each key, the smallest of kRecencyWindows at the end of a sequence of n
// positions holding a position q with key_at(q) equal to it; kRecencyBuckets if none.
// The distinct keys go in a small open-addressing table, then one backward pass over
// the window stops once every one of them was seen.
template <class KeyAt>
std::vector<int8_t> window_buckets(const std::vector<uint64_t>& keys, int64_t n, KeyAt key_at) {
    std::vector<int8_t> out(keys.size(), kRecencyBuckets);
    if (keys.empty()) return out;
    int bits = 6;
    while ((size_t{1} << bits) < 4 * keys.size()) ++bits;
    const size_t mask = (size_t{1} << bits) - 1;
    struct Slot {
        uint64_t key;
        int8_t bucket;  // kRecencyBuckets until seen
        bool used;
    };
    std::vector<Slot> table(mask + 1, Slot{0, kRecencyBuckets, false});
    auto slot_of = [&](uint64_t k) {
        size_t h = static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> (64 - bits));
        while (table[h].used && table[h].key != k) h = (h + 1) & mask;
        return h;
    };
    size_t distinct = 0;
    for (uint64_t k : keys) {
        Slot& slot = table[slot_of(k)];
        if (!slot.used) {
            slot = Slot{k, kRecencyBuckets, true};
            ++distinct;
        }
    }
    const int64_t window = std::min<int64_t>(n, kRecencyWindows[kRecencyBuckets - 1]);
    int bucket = 0;
    for (int64_t back = 0; back < window && distinct > 0; ++back) {
        while (back >= kRecencyWindows[bucket]) ++bucket;
        Slot& slot = table[slot_of(key_at(n - 1 - back))];
        if (slot.used && slot.bucket == kRecencyBuckets) {
            slot.bucket = static_cast<int8_t>(bucket);
            --distinct;
        }
    }
    for (size_t i = 0; i < keys.size(); ++i) out[i] = table[slot_of(keys[i])].bucket;
    return out;
}

uint64_t pair_key(Token a, Token b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

std::vector<int8_t> recency_buckets(const std::vector<Token>& transcript, const std::vector<Token>& tokens) {
    std::vector<uint64_t> keys(tokens.begin(), tokens.end());
    for (uint64_t& k : keys) k = static_cast<uint32_t>(k);
    return window_buckets(keys, static_cast<int64_t>(transcript.size()),
                          [&](int64_t q) { return static_cast<uint64_t>(static_cast<uint32_t>(transcript[q])); });
}

std::vector<int8_t> pair_recency_buckets(const std::vector<Token>& transcript, const std::vector<Token>& tokens,
                                         const std::vector<int32_t>& parents) {
    std::vector<int8_t> out(tokens.size(), kRecencyBuckets);
    if (transcript.empty()) return out;
    std::vector<uint64_t> keys(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i)
        keys[i] = pair_key(parents[i] < 0 ? transcript.back() : tokens[parents[i]], tokens[i]);
    // position 0 has no pair: a key no pair of (non-negative) tokens can equal
    return window_buckets(keys, static_cast<int64_t>(transcript.size()), [&](int64_t q) {
        return q > 0 ? pair_key(transcript[q - 1], transcript[q]) : ~uint64_t{0};
    });
}

Draft speculate_multi(const std::vector<SuffixTree*>& trees, const std::vector<double>& weights,
                      const std::vector<int64_t>& tail_seqs, const std::vector<Token>& context,
                      const SpecParams& params, double match_power) {
    Draft draft = speculate_mixture(trees, weights, tail_seqs, context, params, match_power);
    draft.backoff = backoff_probs(trees, context, draft.tokens, draft.parents);
    const int64_t n = static_cast<int64_t>(context.size());
    for (size_t s = 0; s < trees.size(); ++s) {
        if (tail_seqs[s] < 0 || !trees[s]->ends_with(tail_seqs[s], context.data(), n)) continue;
        if (const std::vector<Token>* transcript = trees[s]->seq_tokens_ref(tail_seqs[s])) {
            draft.recency = recency_buckets(*transcript, draft.tokens);
            draft.pair_recency = pair_recency_buckets(*transcript, draft.tokens, draft.parents);
        }
        break;
    }
    return draft;
}

}  // namespace suffixcache
