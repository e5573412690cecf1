/* SPDX-License-Identifier: MIT */
/*
 * store_route.h - the backend a root names, and one ops table that routes
 * every hook to it (route.c): what the daemon uses.
 */
#ifndef CKPT_STORE_STORE_ROUTE_H
#define CKPT_STORE_STORE_ROUTE_H

#include "store/store.h"

/* store_s3 for "s3://..." roots, else store_local. */
const struct store_ops *store_for_root(const char *root);

/* Arenas attached to every usable backend; attempts and shards to the one
 * their root names. */
extern const struct store_ops store_routed;

#endif
