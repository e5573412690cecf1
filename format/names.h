/* SPDX-License-Identifier: MIT */
/*
 * names.h - validation of the names a peer or a user gives us.
 *
 * Each returns true if the name is acceptable.  On false, and if err is not
 * NULL, a reason ("checkpoint name '../x' contains '/'") is written to err.
 */
#ifndef CKPT_FORMAT_NAMES_H
#define CKPT_FORMAT_NAMES_H

#include <stdbool.h>
#include <stddef.h>

/* Checkpoint name: 1..CKPT_MAX_NAME_LEN of [A-Za-z0-9._-], not starting with
 * '.' (so never ".", "..", or a hidden work directory). */
bool name_checkpoint_ok(const char *name, char *err, size_t errlen);

/* Job id: 1..CKPT_MAX_JOB_LEN of [A-Za-z0-9._-]. */
bool name_job_ok(const char *job, char *err, size_t errlen);

/* A run id: "" (none) or the job id's rule with CKPT_MAX_RUN_LEN. */
bool name_run_ok(const char *run, char *err, size_t errlen);

/* True for the characters of names, job and run ids: [A-Za-z0-9._-]. */
bool name_portable_char(char c);

/* Tensor or blob name, metadata/metric key: 1..CKPT_MAX_ITEM_NAME bytes of
 * printable ASCII (0x20..0x7e), not starting with "__" (reserved, e.g.
 * safetensors' "__metadata__"). */
bool name_item_ok(const char *name, char *err, size_t errlen);

/* Root directory: absolute, at most PATH_MAX - 256 bytes, no "." or ".."
 * component, no empty component other than a trailing '/'. */
bool name_root_ok(const char *root, char *err, size_t errlen);

#endif
