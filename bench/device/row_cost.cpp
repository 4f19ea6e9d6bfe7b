// What k verified rows cost against one decode, measured with llama.cpp alone (issue 48's
// device kit; the daemon's own cost profile measures the same through llama-cpp-python).
//
// A verification step decodes k tokens at the end of a context and needs every row's
// logits; llama-bench's prompt test asks for the last row's only, which on a model with a
// large vocabulary (gemma-3: 262,144) leaves out most of the output head's price. So each
// k is timed both ways: "all" (a verifier's step) and "last" (llama-bench's pp-k).
//
//   row_cost MODEL [--ngl N] [--threads T] [--prompt P] [--ks 1,2,4,8] [--reps R]
//            [--seqs S] [--no-extra-bufts] [--flash-attn on|off|auto] [--label TEXT]
//
// Prints one JSON object on stdout: the model, the settings, and per k the median, min and
// max milliseconds of one decode of k rows, each rep starting from the same P-token
// context (the k rows are removed again after every rep). With --seqs S, S sequences (S
// agents, a KV stream each as the daemon keeps them) of P tokens each decode k rows each
// in one batch. Progress goes to stderr.

#include "ggml-backend.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Options {
    std::string model;
    std::string label;
    int ngl = 0;
    int threads = 0;
    int prompt = 256;
    int reps = 5;
    int seqs = 1;
    bool extra_bufts = true;
    std::vector<int> ks = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
    llama_flash_attn_type flash_attn = LLAMA_FLASH_ATTN_TYPE_AUTO;
};

[[noreturn]] void usage(const char * why) {
    std::fprintf(stderr, "row_cost: %s\nusage: row_cost MODEL [--ngl N] [--threads T] [--prompt P] "
                         "[--ks 1,2,4] [--reps R] [--seqs S] [--no-extra-bufts] [--flash-attn on|off|auto] "
                         "[--label TEXT]\n",
                 why);
    std::exit(2);
}

std::vector<int> parse_ks(const std::string & text) {
    std::vector<int> ks;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
        const int k = std::atoi(item.c_str());
        if (k < 1) usage("--ks takes positive integers");
        ks.push_back(k);
    }
    if (ks.empty()) usage("--ks is empty");
    return ks;
}

Options parse(int argc, char ** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) usage((arg + " needs a value").c_str());
            return argv[++i];
        };
        if (arg == "--ngl") o.ngl = std::atoi(value().c_str());
        else if (arg == "--threads") o.threads = std::atoi(value().c_str());
        else if (arg == "--prompt") o.prompt = std::atoi(value().c_str());
        else if (arg == "--reps") o.reps = std::atoi(value().c_str());
        else if (arg == "--seqs") o.seqs = std::atoi(value().c_str());
        else if (arg == "--no-extra-bufts") o.extra_bufts = false;
        else if (arg == "--ks") o.ks = parse_ks(value());
        else if (arg == "--label") o.label = value();
        else if (arg == "--flash-attn") {
            const std::string v = value();
            o.flash_attn = v == "on" ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                         : v == "off" ? LLAMA_FLASH_ATTN_TYPE_DISABLED : LLAMA_FLASH_ATTN_TYPE_AUTO;
        } else if (o.model.empty() && arg.rfind("--", 0) != 0) o.model = arg;
        else usage(("unknown argument " + arg).c_str());
    }
    if (o.model.empty()) usage("no model");
    if (o.prompt < 1 || o.reps < 1 || o.seqs < 1) usage("--prompt, --reps and --seqs must be positive");
    return o;
}

double now_ms() {
    using clock = std::chrono::steady_clock;
    return std::chrono::duration<double, std::milli>(clock::now().time_since_epoch()).count();
}

// Decodes tokens[0..n) at positions pos0.. in each of sequences [0, seqs), in one batch,
// with logits for every row or for each sequence's last only.
void decode(llama_context * ctx, llama_batch & batch, const std::vector<llama_token> & tokens,
            int pos0, bool all_logits, int seqs = 1) {
    const size_t n = tokens.size();
    batch.n_tokens = (int32_t) (n * seqs);
    for (int s = 0; s < seqs; ++s) {
        for (size_t i = 0; i < n; ++i) {
            const size_t row = s * n + i;
            batch.token[row] = tokens[i];
            batch.pos[row] = pos0 + (llama_pos) i;
            batch.n_seq_id[row] = 1;
            batch.seq_id[row][0] = s;
            batch.logits[row] = all_logits || i + 1 == n;
        }
    }
    if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "row_cost: llama_decode failed (%d x %zu rows at %d)\n", seqs, n, pos0);
        std::exit(1);
    }
    llama_synchronize(ctx);
}

struct Timing {
    double median, min, max;
};

Timing summarize(std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    const size_t n = ms.size();
    const double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
    return {median, ms.front(), ms.back()};
}

}  // namespace

int main(int argc, char ** argv) {
    const Options o = parse(argc, argv);
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
    }, nullptr);
    ggml_backend_load_all();  // a GGML_BACKEND_DL build's CPU variants and CUDA, beside the binary
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = o.ngl;
    // Repacked (and on AMX CPUs, AMX-laid) weights: llama.cpp's default; 0.3.36's AMX
    // multiply crashed on a Sapphire Rapids VM, hence the switch.
    mp.use_extra_bufts = o.extra_bufts;
    const double load0 = now_ms();
    llama_model * model = llama_model_load_from_file(o.model.c_str(), mp);
    if (!model) usage(("cannot load " + o.model).c_str());
    const double load_ms = now_ms() - load0;

    const int max_k = *std::max_element(o.ks.begin(), o.ks.end());
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (o.seqs * (o.prompt + max_k + 16));
    cp.n_batch = (uint32_t) std::max(512, o.seqs * max_k);
    cp.n_ubatch = cp.n_batch;
    cp.n_seq_max = (uint32_t) o.seqs;
    cp.kv_unified = false;  // a stream per sequence, as the daemon's slots
    cp.flash_attn_type = o.flash_attn;
    cp.swa_full = true;  // so the k rows can be removed again whatever the window
    if (o.threads > 0) {
        cp.n_threads = o.threads;
        cp.n_threads_batch = o.threads;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) usage("cannot create the context");
    llama_memory_t mem = llama_get_memory(ctx);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    // The weights are synthetic and the timings do not depend on the tokens: any ids will do,
    // the same ones for every rep.
    std::mt19937 rng(48);
    std::uniform_int_distribution<int> any_token(4, n_vocab - 1);
    std::vector<llama_token> prompt(o.prompt);
    for (auto & t : prompt) t = any_token(rng);
    std::vector<llama_token> rows(max_k);
    for (auto & t : rows) t = any_token(rng);

    llama_batch batch = llama_batch_init((int32_t) cp.n_batch, 0, 1);
    const double prefill0 = now_ms();
    const int chunk = (int) cp.n_batch / o.seqs;
    for (int start = 0; start < o.prompt; start += chunk) {
        const int end = std::min(o.prompt, start + chunk);
        decode(ctx, batch, std::vector<llama_token>(prompt.begin() + start, prompt.begin() + end), start,
               false, o.seqs);
    }
    const double prefill_ms = now_ms() - prefill0;
    std::fprintf(stderr, "row_cost: %s loaded in %.0f ms, %d-token prompt in %.0f ms\n",
                 o.model.c_str(), load_ms, o.prompt, prefill_ms);

    auto time_rows = [&](int k, bool all_logits) {
        const std::vector<llama_token> step(rows.begin(), rows.begin() + k);
        std::vector<double> ms;
        for (int r = 0; r < o.reps; ++r) {
            const double t0 = now_ms();
            decode(ctx, batch, step, o.prompt, all_logits, o.seqs);
            ms.push_back(now_ms() - t0);
            for (int s = 0; s < o.seqs; ++s) {
                if (!llama_memory_seq_rm(mem, s, o.prompt, -1)) {
                    std::fprintf(stderr, "row_cost: cannot remove the rows again\n");
                    std::exit(1);
                }
            }
        }
        return summarize(ms);
    };
    // Warm-up: the first decodes of each size pay for allocations and, on a GPU, graph capture.
    for (int k : o.ks) time_rows(k, true);

    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    std::printf("{\"model\": \"%s\", \"desc\": \"%s\", \"label\": \"%s\", \"size_bytes\": %llu, "
                "\"n_params\": %llu, \"ngl\": %d, \"threads\": %d, \"prompt\": %d, \"seqs\": %d, \"reps\": %d, \"extra_bufts\": %s, "
                "\"flash_attn\": \"%s\", \"load_ms\": %.1f, \"prefill_ms\": %.1f, \"rows\": [",
                o.model.c_str(), desc, o.label.c_str(), (unsigned long long) llama_model_size(model),
                (unsigned long long) llama_model_n_params(model), o.ngl, (int) cp.n_threads, o.prompt,
                o.seqs, o.reps, o.extra_bufts ? "true" : "false", llama_flash_attn_type_name(o.flash_attn), load_ms, prefill_ms);
    for (size_t i = 0; i < o.ks.size(); ++i) {
        const int k = o.ks[i];
        const Timing all = time_rows(k, true);
        const Timing last = time_rows(k, false);
        std::fprintf(stderr, "row_cost: k=%d all %.2f ms, last %.2f ms\n", k, all.median, last.median);
        std::printf("%s{\"k\": %d, \"all_ms\": %.3f, \"all_min_ms\": %.3f, \"all_max_ms\": %.3f, "
                    "\"last_ms\": %.3f, \"last_min_ms\": %.3f, \"last_max_ms\": %.3f}",
                    i ? ", " : "", k, all.median, all.min, all.max, last.median, last.min, last.max);
        std::fflush(stdout);
    }
    std::printf("], \"system_info\": \"%s\"}\n", llama_print_system_info());

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
