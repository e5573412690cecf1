/* SPDX-License-Identifier: MIT */
/*
 * store_local.h - what the spill tier (spill.c) needs of the local backend
 * beyond its ops table, and the parts of the backend that live apart.
 */
#ifndef CKPT_STORE_STORE_LOCAL_H
#define CKPT_STORE_STORE_LOCAL_H

#include "store/store.h"

/* root_open of the local backend (store.h), in root.c. */
int store_local_root_open(const char *base, const char *root, int *ret_fd, char *err,
			  size_t errlen);

/* The work area of a local attempt: the root's fd, the area's fd and its
 * name in the root (owned by the attempt). */
void store_local_area(const struct store_attempt *a, int *rootfd, int *workfd, const char **work);

#endif
