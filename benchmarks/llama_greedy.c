/* Greedy decoding through llama.cpp's C API (libllama), for benchmarks/gemma_vs_llamacpp.py.
 *
 *   llama_greedy MODEL.gguf N_TOKENS THREADS [f32kv] < prompts.txt
 *
 * One prompt per input line (a literal "\n" in a line stands for a newline). For each prompt it
 * prints one JSON line: the prompt's ids as llama.cpp tokenizes it (add_special: BOS when the
 * GGUF says add_bos_token, as llama-simple and llama-cli do), then N_TOKENS ids chosen by argmax
 * of the logits (llama_sampler_init_greedy's rule; end-of-generation tokens do not stop it, so
 * both sides always produce N_TOKENS), and at every step the top 5 (id, logit) pairs, so a
 * divergence can be judged a tie or not. N_TOKENS 0: only the prompt's ids (any length). Built against the llama.cpp tree tests/llamacpp.py
 * unpacks; the memory is cleared between prompts, the context's other settings are the defaults
 * (F16 KV cache, flash attention auto); ``f32kv`` makes the KV cache F32 and turns flash attention
 * off, to see how far llama.cpp's own arithmetic choices move its greedy tokens. Everything else
 * goes to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

#define TOP 5

static void quiet(enum ggml_log_level level, const char *text, void *data) {
    (void)data;
    if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static void unescape(char *s) {   /* "\n" -> newline, "\\" -> backslash, in place */
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] == 'n') { *w++ = '\n'; r++; }
        else if (r[0] == '\\' && r[1] == '\\') { *w++ = '\\'; r++; }
        else *w++ = *r;
    }
    *w = 0;
}

static void top_k(const float *logits, int n_vocab, int *ids, float *vals) {
    for (int k = 0; k < TOP; k++) { ids[k] = -1; vals[k] = -1e30f; }
    for (int i = 0; i < n_vocab; i++) {
        float v = logits[i];
        if (v <= vals[TOP - 1]) continue;
        int k = TOP - 1;
        while (k > 0 && vals[k - 1] < v) { vals[k] = vals[k - 1]; ids[k] = ids[k - 1]; k--; }
        vals[k] = v; ids[k] = i;   /* strict '<': the lowest id wins a tie, as argmax does */
    }
}

int main(int argc, char **argv) {
    if (argc != 4 && !(argc == 5 && strcmp(argv[4], "f32kv") == 0)) {
        fprintf(stderr, "usage: %s MODEL.gguf N_TOKENS THREADS [f32kv] < prompts\n", argv[0]);
        return 2;
    }
    int n_gen = atoi(argv[2]), threads = atoi(argv[3]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 2048;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    if (argc == 5) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }

    enum { LINE = 1 << 20, MAX_IDS = 1 << 18 };
    char *line = malloc(LINE);
    llama_token *prompt = malloc(sizeof(llama_token) * MAX_IDS);
    int ids[TOP];
    float vals[TOP];
    while (fgets(line, LINE, stdin)) {
        line[strcspn(line, "\n")] = 0;
        unescape(line);
        int n = llama_tokenize(vocab, line, (int)strlen(line), prompt, MAX_IDS, true, false);
        if (n < 0) { fprintf(stderr, "prompt too long\n"); return 1; }
        llama_memory_clear(llama_get_memory(ctx), true);
        printf("{\"prompt_ids\": [");
        for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", prompt[i]);
        printf("], \"steps\": [");
        if (n_gen > 0 && llama_decode(ctx, llama_batch_get_one(prompt, n)) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
        for (int step = 0; step < n_gen; step++) {
            top_k(llama_get_logits_ith(ctx, -1), n_vocab, ids, vals);
            printf("%s[", step ? ", " : "");
            for (int k = 0; k < TOP; k++) printf("%s[%d, %.6f]", k ? ", " : "", ids[k], vals[k]);
            printf("]");
            llama_token next = ids[0];
            if (step + 1 < n_gen && llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) {
                fprintf(stderr, "decode failed\n");
                return 1;
            }
        }
        printf("]}\n");
        fflush(stdout);
    }
    free(line);
    free(prompt);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
