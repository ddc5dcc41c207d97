/*
 * output_manifest.h: the manifest beside the output (output.c's), built and compared.
 */
#ifndef TP_OUTPUT_MANIFEST_H
#define TP_OUTPUT_MANIFEST_H

#include <jansson.h>

#include "output.h"

/* The manifest of this run, status "running" (a new JSON object in *out). */
tp_status tp_manifest_build(const tp_manifest *m, json_t **out);
/* An earlier run's manifest against this one's: a field that identifies the run (model files,
 * hashes, input, settings) and differs is an error naming it, or a warning with force; the
 * version, model_dir and input path only warn. */
tp_status tp_manifest_compare(const json_t *old, json_t *now, int force, const char *manifest_path);

#endif
