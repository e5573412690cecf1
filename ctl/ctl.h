/* SPDX-License-Identifier: MIT */
/* ctl.h - what ckptctl's files share (ckptctl.c, prune.c). */
#ifndef CKPT_CTL_H
#define CKPT_CTL_H

#include <jansson.h>
#include <stdbool.h>

#include "format/retention.h"

/* Exit statuses (README: ckptctl). */
#define CTL_EXIT_ERROR   1
#define CTL_EXIT_USAGE   2
#define CTL_EXIT_DEGRADED 5 /* done, but part of the input could not be read */
#define CTL_EXIT_REFUSED 6 /* a safety rule refused the operation */

/* "ckptctl: <message>" on stderr, control bytes shown as '?'. */
void ctl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One compact JSON object on its own line (--json).  0 or -ENOMEM. */
int ctl_json_line(const json_t *j);
/* A copy of a name fit to print and to put in JSON ('?' for control and
 * non-ASCII bytes), or NULL (out of memory). */
char *ctl_display(const char *s);

/* ckptctl pin|unpin ROOT NAME (prune.c): returns the exit status. */
int ctl_pin(const char *root, const char *name, bool pin);

/* ckptctl prune ROOT [--dry-run] (prune.c): returns the exit status. */
int ctl_prune(const char *root, const struct ret_policy *p, bool force, bool dry_run, bool json);

/* ckptctl verify ROOT/NAME (verify.c): every CRC, coverage and size of one
 * committed checkpoint; returns the exit status (0 whole, 1 damaged or
 * unreadable). */
int ctl_verify(const char *path, bool json);

#endif
