/*
 * engine_requests.c: the input's requests as the engine's (engine.c's phase 1): the run's
 * defaults and each line's own sampling settings, chat messages rendered by the template,
 * prompts tokenized as they are read (a replica's ranks split them), and what a request asks
 * checked against the model; a request that cannot run carries its error instead.
 */
#include "config.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "log.h"

static void set_request_error(req *r, const char *code)
{
    r->error_code = code;
    free(r->error_message);
    r->error_message = strdup(*tp_error_message() ? tp_error_message() : code);
    tp_error_clear();
}

static void default_sampling(const engine *e, tp_sampling_params *sp)
{
    const tp_options *o = e->o;
    tp_sampling_params_default(sp);
    if (e->gen.do_sample == 1) { /* the model's own defaults, as transformers' generate() */
        sp->temperature = e->gen.temperature >= 0 ? e->gen.temperature : 1.0;
        if (e->gen.top_k >= 0) sp->top_k = (int32_t)e->gen.top_k;
        if (e->gen.top_p >= 0) sp->top_p = e->gen.top_p;
    }
    if (e->gen.repetition_penalty > 0) sp->repetition_penalty = e->gen.repetition_penalty;
    if (o->temperature >= 0) sp->temperature = o->temperature;
    if (o->top_k >= -1) sp->top_k = (int32_t)o->top_k;
    if (o->top_p >= 0) sp->top_p = o->top_p;
}

static void apply_params(engine *e, req *r)
{
    const tp_request_params *p = &r->in->p;
    default_sampling(e, &r->sp);
    if (p->has_temperature) r->sp.temperature = p->temperature;
    if (p->has_top_k) r->sp.top_k = p->top_k;
    if (p->has_top_p) r->sp.top_p = p->top_p;
    if (p->has_min_p) r->sp.min_p = p->min_p;
    if (p->has_repetition_penalty) r->sp.repetition_penalty = p->repetition_penalty;
    if (p->has_presence_penalty) r->sp.presence_penalty = p->presence_penalty;
    if (p->has_frequency_penalty) r->sp.frequency_penalty = p->frequency_penalty;
    r->sp.logprobs = p->has_logprobs ? p->logprobs : 0;
    /* a line's own seed alone names its stream (the same request and seed, the same
     * completion, as vLLM and OpenAI promise); else --seed and the id */
    r->sp.seed = p->has_seed ? tp_sampler_request_seed(p->seed, NULL) : tp_sampler_request_seed(e->o->seed, r->in->id);
    r->ignore_eos = p->has_ignore_eos ? p->ignore_eos : e->o->ignore_eos;
    /* vLLM's hermes and mistral parsers keep special tokens: their markers are special in
     * some models (Hermes 3's <tool_call>, Mistral's [TOOL_CALLS]) */
    const int keep_markers = r->in->parse_tool_calls && (e->o->tool_call_parser == TP_TOOL_PARSER_HERMES ||
                                                         e->o->tool_call_parser == TP_TOOL_PARSER_MISTRAL);
    r->skip_special = p->has_skip_special_tokens ? p->skip_special_tokens : !keep_markers;
    r->include_stop = p->has_include_stop_str_in_output ? p->include_stop_str_in_output : 0;
    r->min_tokens = p->has_min_tokens ? p->min_tokens : 0;
    r->n = p->has_n ? p->n : 1;
    r->prompt_lp = p->has_prompt_logprobs ? p->prompt_logprobs : -1;
    /* echo with logprobs: the prompt's tokens' logprobs come first in the output (vLLM) */
    if (p->echo && p->has_logprobs && p->logprobs > r->prompt_lp) r->prompt_lp = p->logprobs;
}

static tp_status render_chat(engine *e, req *r, tp_ids *ids)
{
    if (!e->tpl)
        return tp_error(TP_ERR_INVALID_ARG, "line %lld: a \"messages\" request needs a chat template: the model "
                        "has none (no chat_template.jinja, tokenizer_config.json's chat_template or chat_template.json); "
                        "give --chat-template FILE", (long long)r->in->line);
    if (r->in->parse_tool_calls && !e->o->tool_call_parser) {
        const tp_tool_parser hint = e->tool_parser_hint;
        return tp_error(TP_ERR_INVALID_ARG, "line %lld: tools with \"tool_choice\" \"auto\" (the default with tools) ask "
                        "for the model's tool calls, and no --tool-call-parser was given to find them in its text%s%s%s; "
                        "or give \"tool_choice\": \"none\" to have the answer as text", (long long)r->in->line,
                        hint ? " (the chat template writes " : ": give hermes, llama3_json or mistral, the format",
                        hint ? tp_tool_parser_marker(hint) : " the model writes calls in",
                        hint ? (hint == TP_TOOL_PARSER_HERMES        ? ": --tool-call-parser hermes)"
                                : hint == TP_TOOL_PARSER_LLAMA3_JSON ? ": --tool-call-parser llama3_json)"
                                                                     : ": --tool-call-parser mistral)")
                             : "");
    }
    json_error_t jerr;
    json_t *msgs = json_loads(r->in->messages_json, 0, &jerr);
    if (!msgs) return tp_error(TP_ERR_INVALID_ARG, "line %lld: messages: %s", (long long)r->in->line, jerr.text);
    json_t *tools = r->in->tools_json ? json_loads(r->in->tools_json, 0, &jerr) : NULL;
    if (r->in->tools_json && !tools) {
        json_decref(msgs);
        return tp_error(TP_ERR_INVALID_ARG, "line %lld: tools: %s", (long long)r->in->line, jerr.text);
    }
    char *text = NULL;
    size_t len = 0;
    tp_status st = tp_chat_template_apply(e->tpl, msgs, tools, r->in->add_generation_prompt,
                                          tp_tokenizer_bos_token(e->tok), tp_tokenizer_eos_token(e->tok), &text, &len);
    json_decref(msgs);
    json_decref(tools);
    /* transformers encodes the rendering without adding special tokens again */
    if (st == TP_OK) st = tp_tokenizer_encode(e->tok, text, len, 0, ids);
    free(text);
    return st;
}

static void drop_text(tp_request *in)
{
    free(in->prompt);
    free(in->messages_json);
    free(in->tools_json);
    in->prompt = in->messages_json = in->tools_json = NULL;
    in->prompt_len = 0;
}

void eng_drop_prompt(tp_request *in)
{
    drop_text(in);
    free(in->prompt_ids);
    in->prompt_ids = NULL;
    in->n_prompt_ids = 0;
}

/* The prompt as token ids, into in->prompt_ids, its text or messages freed: a replica keeps
 * only ids, and from as soon as a line is read (no text for the whole input at once). A
 * prompt that cannot be encoded becomes the request's error. Its sampling settings are
 * checked first (eng_prepare_request says what is wrong with them, as before any encoding). */
static tp_status encode_input(engine *e, tp_request *in)
{
    if (in->error_code || in->encoded || in->prompt_ids) return TP_OK; /* given ids are checked in eng_prepare_request */
    req probe = {.in = in};
    apply_params(e, &probe);
    if (tp_sampling_params_validate(&probe.sp) != TP_OK) {
        tp_error_clear();
        return TP_OK;
    }
    /* encoded into a scratch vector reused across prompts, then copied to a block of the
     * exact size: the replica holds every prompt of its share until it runs, and the
     * encoder's doubling would leave up to half of each spare (64 ids for the shortest) */
    tp_ids *ids = &e->encode_scratch;
    ids->n = 0;
    tp_status st = in->messages_json ? render_chat(e, &probe, ids)
                                     : tp_tokenizer_encode(e->tok, in->prompt, in->prompt_len, 1, ids);
    if (st == TP_OK && in->messages_json && ids->n == 0) /* nothing for the model to go on */
        st = tp_error(TP_ERR_INVALID_ARG, "line %lld: the chat template (%s%s) renders these messages as no text",
                      (long long)in->line, e->o->chat_template ? "--chat-template " : "the model's ",
                      e->o->chat_template ? e->o->chat_template : tp_tokenizer_chat_template_file(e->tok));
    /* past vocab_size the embedding reads zeros */
    for (size_t i = 0; st == TP_OK && i < ids->n; i++)
        if (ids->v[i] < 0 || ids->v[i] >= e->cfg.vocab_size)
            st = tp_error(TP_ERR_INVALID_ARG, "line %lld: the tokenizer gave token %d, beyond the model's embedding "
                          "(config.json's vocab_size %lld): a token added to tokenizer.json that the weights lack, or "
                          "a tokenizer of another model", (long long)in->line, ids->v[i], (long long)e->cfg.vocab_size);
    int32_t *exact = NULL;
    if (st == TP_OK && !(exact = malloc(ids->n ? ids->n * sizeof *exact : sizeof *exact)))
        st = tp_error(TP_ERR_OOM, "out of memory for %zu token ids (line %lld)", ids->n, (long long)in->line);
    if (st == TP_ERR_OOM) return st;
    eng_drop_prompt(in);
    in->encoded = 1;
    e->n_encoded++;
    if (st != TP_OK) {
        in->error_code = "invalid_request";
        in->error_message = strdup(*tp_error_message() ? tp_error_message() : in->error_code);
        tp_error_clear();
        return in->error_message ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    if (ids->n) memcpy(exact, ids->v, ids->n * sizeof *exact);
    in->prompt_ids = exact;
    in->n_prompt_ids = (int32_t)ids->n;
    return TP_OK;
}

/* A replica's ranks split the tokenizing of its share (tp_share_encodes): the others drop
 * a request's text as soon as it is read. */
static int encodes(const engine *e, size_t k) { return tp_share_encodes(e->w->replica, k); }

/* The reader's callback: each request of this replica's share, as it is read, the k-th.
 * With --resume the first read only finds the ids (the share is read again once the done
 * ones are known: reread_to_go); otherwise the rank that encodes it does so at once. */
tp_status eng_take_kept(void *arg, tp_request *in)
{
    engine *e = arg;
    const size_t k = e->n_kept_read++;
    if (e->o->resume && !e->reread) {
        eng_drop_prompt(in);
        return TP_OK;
    }
    if (!encodes(e, k)) {
        drop_text(in);
        return TP_OK;
    }
    return eng_stop_signal() ? TP_OK : encode_input(e, in);
}

tp_status eng_prepare_request(engine *e, req *r)
{
    tp_request *in = r->in; /* encoded by now (eng_take_kept, or a peer through prepare_all) */
    if (in->error_code) {
        r->error_code = in->error_code;
        r->error_message = strdup(in->error_message ? in->error_message : in->error_code);
        return r->error_message ? TP_OK : tp_error(TP_ERR_OOM, "out of memory");
    }
    apply_params(e, r);
    if (tp_sampling_params_validate(&r->sp) != TP_OK) {
        set_request_error(r, "invalid_request");
        return TP_OK;
    }
    if (!in->encoded && !in->prompt_ids) /* every prompt is encoded as its line is read (eng_take_kept) */
        return tp_error(TP_ERR_INTERNAL, "line %lld: the prompt was not tokenized", (long long)in->line);
    if (!in->encoded) /* the line's own ids */
        for (int32_t i = 0; i < in->n_prompt_ids; i++)
            if (in->prompt_ids[i] >= e->cfg.vocab_size) {
                tp_error(TP_ERR_INVALID_ARG, "line %lld: prompt token %d is outside the vocabulary of %lld",
                         (long long)in->line, in->prompt_ids[i], (long long)e->cfg.vocab_size);
                set_request_error(r, "invalid_request");
                return TP_OK;
            }
    r->prompt = in->prompt_ids; /* the request takes them */
    r->n_prompt = in->n_prompt_ids;
    in->prompt_ids = NULL;
    in->n_prompt_ids = 0;
    if (r->n_prompt == 0) {
        tp_error(TP_ERR_INVALID_ARG, "line %lld: the prompt encodes to no tokens", (long long)in->line);
        set_request_error(r, "invalid_request");
        return TP_OK;
    }
    if (r->n_prompt >= e->max_model_len) {
        tp_error(TP_ERR_INVALID_ARG,
                 "line %lld: the prompt has %d tokens; the context is %d tokens (--max-model-len), which leaves "
                 "no room to generate",
                 (long long)in->line, r->n_prompt, e->max_model_len);
        set_request_error(r, "context_length_exceeded");
        return TP_OK;
    }
    int32_t room = e->max_model_len - r->n_prompt;
    /* an OpenAI chat line without max_tokens may use the context's room (OpenAI, vLLM),
     * unless --max-tokens says otherwise; everything else --max-tokens (default 16) */
    int32_t want = in->p.has_max_tokens                                             ? in->p.max_tokens
                   : tp_request_chat_without_max_tokens(in) && !e->o->max_tokens_given ? room
                                                                                  : (int32_t)e->o->max_tokens;
    if (in->p.has_max_tokens && want > room) {
        tp_error(TP_ERR_INVALID_ARG,
                 "line %lld: max_tokens %d + %d prompt tokens exceed the context of %d tokens (--max-model-len)",
                 (long long)in->line, want, r->n_prompt, e->max_model_len);
        set_request_error(r, "context_length_exceeded");
        return TP_OK;
    }
    const char *guided = in->p.n_choices     ? "guided_choice"
                         : in->p.json_object ? "structured output (response_format, guided_json or guided_regex)"
                                             : NULL;
    if (guided && r->ignore_eos) { /* the line's own ignore_eos is refused as it is read */
        tp_error(TP_ERR_INVALID_ARG, "line %lld: %s with --ignore-eos: the text ends at the end token; "
                 "give the line \"ignore_eos\": false", (long long)in->line, guided);
        set_request_error(r, "invalid_request");
        return TP_OK;
    }
    if (guided && e->n_eos == 0) {
        tp_error(TP_ERR_INVALID_ARG, "line %lld: %s needs the model's end-of-sequence token to end the "
                 "text, and %s names none (config.json, generation_config.json)", (long long)in->line, guided,
                 e->model_name);
        set_request_error(r, "invalid_request");
        return TP_OK;
    }
    r->max_new = want < room ? want : room;
    if (r->min_tokens > r->max_new) r->min_tokens = r->max_new;
    return TP_OK;
}

tp_status eng_load_chat_template(engine *e)
{
    const char *own = e->o->chat_template;
    const char *src = tp_tokenizer_chat_template(e->tok);
    char *file = NULL;
    tp_status st = TP_OK;
    if (own) {
        TP_CHECK(tp_chat_template_create_from_file(own, &file, &e->tpl));
        src = file;
    } else if (src) {
        st = tp_chat_template_create(src, strlen(src), &e->tpl);
        if (st == TP_ERR_UNSUPPORTED) {
            tp_log_info0("the model's chat template (its %s) is not supported (%s); \"messages\" requests need "
                         "--chat-template FILE", tp_tokenizer_chat_template_file(e->tok), tp_error_message());
            tp_error_clear();
            st = TP_OK;
        }
    }
    if (src) e->tool_parser_hint = tp_tool_parser_of_template(src);
    if (st == TP_OK && e->tpl && tp_chat_template_partial(e->tpl))
        tp_log_info0("the chat template has code outside tpinfer's Jinja subset in branches that not every "
                     "request takes: %s; a request whose rendering reaches it becomes an error record naming it%s",
                     tp_chat_template_partial(e->tpl), own ? "" : " (--chat-template FILE gives a template of your own)");
    free(file);
    return st;
}

/* The engine's side of each request kept. */
tp_status eng_make_requests(engine *e)
{
    free(e->R);
    e->R = calloc(e->reqs.n ? e->reqs.n : 1, sizeof *e->R);
    if (!e->R) return tp_error(TP_ERR_OOM, "out of memory for %zu requests", e->reqs.n);
    for (size_t i = 0; i < e->reqs.n; i++) {
        e->R[i].in = &e->reqs.v[i];
        e->R[i].index = e->R[i].runnable = -1;
    }
    return TP_OK;
}
