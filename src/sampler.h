/*
 * sampler.h: from one row of full-vocabulary logits to the next token, as vLLM and
 * Hugging Face define each rule, in Hugging Face's order: penalties, temperature, top-k,
 * top-p, min-p (vLLM applies min-p before top-p: tests/check_sampler.c), then a
 * draw from a per-request random stream (or argmax when greedy). The stream depends only
 * on (global seed, request id, step), so a completion is the same whatever it is batched
 * with, however the ranks are laid out, and after a resume.
 */
#ifndef TP_SAMPLER_H
#define TP_SAMPLER_H

#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most top logprobs a token reports (OpenAI's top_logprobs limit, vLLM's default max_logprobs). */
#define TP_MAX_LOGPROBS 20

typedef struct tp_sampling_params {
    double temperature;        /* 0: greedy (argmax, ties to the lowest id) */
    int32_t top_k;             /* <= 0: off */
    double top_p;              /* 1: off; in (0, 1] */
    double min_p;              /* 0: off; in [0, 1] */
    double repetition_penalty; /* 1: off; > 0 (HF: divides positive logits of seen tokens, multiplies negative) */
    double presence_penalty;   /* 0: off; in [-2, 2] (OpenAI: subtract once per token present in the output) */
    double frequency_penalty;  /* 0: off; in [-2, 2] (subtract count * penalty, output tokens) */
    uint64_t seed;             /* the request's seed (see tp_sampler_request_seed) */
    int32_t logprobs;          /* top-N logprobs to report per token; 0: none */
    int32_t logprob_off;       /* 1: the chosen token's logprob is not wanted: result->logprob is 0,
                                * and with logprobs 0 the row's log-sum-exp is skipped */
} tp_sampling_params;

void tp_sampling_params_default(tp_sampling_params *p); /* greedy, everything off */

/* Check ranges; the message names the field ("top_p 1.5 is outside (0, 1]"). */
tp_status tp_sampling_params_validate(const tp_sampling_params *p);

/* The seed of one request's stream: a hash of the global seed and the request id string. */
uint64_t tp_sampler_request_seed(uint64_t global_seed, const char *request_id);

typedef struct tp_token_logprob {
    int32_t id;
    float logprob;
} tp_token_logprob;

typedef struct tp_sample_result {
    int32_t token;
    float logprob;             /* of the chosen token under the unmodified distribution (log_softmax of raw logits) */
    int32_t n_top;
    tp_token_logprob *top;     /* [n_top] caller-provided array of params.logprobs entries, best first */
} tp_sample_result;

typedef struct tp_sampler tp_sampler;

/* A scratch object for one vocabulary size; not thread-safe: one per thread. */
tp_status tp_sampler_create(int32_t vocab_size, tp_sampler **out);
void tp_sampler_destroy(tp_sampler *s); /* accepts NULL */

/* Sample the token of step `step` (0 for the first generated token) of a request.
 * logits [vocab] f32 (not modified); prompt/output: the request's tokens so far (the
 * penalties read them: repetition over prompt + output as HF does, presence/frequency
 * over output as OpenAI does). result->top must have room for params->logprobs entries. */
tp_status tp_sampler_sample(tp_sampler *s, const tp_sampling_params *params, uint64_t step,
                            const float *logits, const int32_t *prompt, int32_t n_prompt,
                            const int32_t *output, int32_t n_output, tp_sample_result *result);
/* What a row's rule changes in the logits before its penalties, in vLLM's order: only the
 * allowed ids stay (allowed_token_ids; none listed: all), the banned are never drawn
 * (min_tokens' end tokens), then each bias is added (logit_bias). The logprobs reported
 * stay those of the raw logits (vLLM's default raw logprobs come before all three), and an
 * excluded (banned or not allowed) column may hold NaN/+Inf (it counts as -inf). */
typedef struct tp_logit_edits {
    const int32_t *allowed;
    int32_t n_allowed;
    const int32_t *banned;
    int32_t n_banned;
    const int32_t *bias_ids; /* distinct ids */
    const float *bias;       /* [n_bias], finite */
    int32_t n_bias;
} tp_logit_edits;

/* tp_sampler_sample with the row's edits (NULL: none). */
tp_status tp_sampler_sample_edited(tp_sampler *s, const tp_sampling_params *params, uint64_t step,
                                   const float *logits, const tp_logit_edits *edits, const int32_t *prompt,
                                   int32_t n_prompt, const int32_t *output, int32_t n_output,
                                   tp_sample_result *result);

#ifdef __cplusplus
}
#endif
#endif
