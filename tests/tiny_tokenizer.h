/*
 * tiny_tokenizer.h: a small byte-level BPE tokenizer.json (six tokens, two merges, a <s>
 * added as BOS by its post-processor), built by hand for the tests that vary or mutate it
 * (check_tokenizer, check_mutations).
 */
#ifndef TP_TINY_TOKENIZER_H
#define TP_TINY_TOKENIZER_H

static const char TINY_TOKENIZER_JSON[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,"
    "\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
    "\"normalized\":false,\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[6],"
    "\"tokens\":[\"<s>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
    "\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"c\":3,\"abc\":4,\"\\u0120\":5},\"merges\":[\"a b\",\"ab c\"]}}";

#endif
