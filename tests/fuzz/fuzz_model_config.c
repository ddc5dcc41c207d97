/* fuzz_model_config.c: the same bytes as config.json and as generation_config.json, and
 * the generation config checked against the model config where both parse. */
#include "fuzz_common.h"
#include "model_config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_model_config cfg;
    tp_generation_config gen;
    const int cfg_ok = tp_model_config_parse((const char *)data, size, "config.json", &cfg) == TP_OK;
    tp_error_clear();
    if (tp_generation_config_parse((const char *)data, size, "generation_config.json", &gen) == TP_OK && cfg_ok)
        tp_generation_config_check(&gen, &cfg, "generation_config.json");
    tp_error_clear();
    return 0;
}
