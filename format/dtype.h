/* SPDX-License-Identifier: MIT */
/*
 * dtype.h - element types by their safetensors names.
 *
 * The public half (ckpt_dtype_name(), ckpt_dtype_size()) is declared in
 * ckpt.h; this is the internal reverse mapping used by the parsers.
 */
#ifndef CKPT_FORMAT_DTYPE_H
#define CKPT_FORMAT_DTYPE_H

#include "ckpt.h"

/* Returns the enum ckpt_dtype named `s` ("F32", exact case), or -EINVAL. */
int dtype_from_name(const char *s);

#endif
