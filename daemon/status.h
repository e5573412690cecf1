/* SPDX-License-Identifier: MIT */
/*
 * status.h - the daemon's status report, read by `ckptctl status`.
 *
 * The report is one JSON object, sent in a memfd (proto.h STATUS_REPLY):
 *
 * {"version":"0.2.0", "pid":123, "uptime_s":12.501,
 *  "config":{"socket":"/run/ckptd/ckptd.sock", "roots":["/data"],
 *            "arena_max":N, "arena_total":N, "uring_depth":16,
 *            "commit_deadline_ms":600000, "max_clients":256,
 *            "max_clients_per_uid":64},
 *  "arena_bytes_total":N,                 bytes of all arenas now
 *  "clients":[{"id":1, "pid":456, "uid":1000, "job":"j", "run":"",
 *              "rank":0, "world":8, "arena_bytes":N, "slot_bytes":N,
 *              "slots":256, "slots_in_use":3, "connected":true}],
 *  "saves":[{"job":"j", "name":"step-1", "root":"/data", "attempt":ID,
 *            "step":100, "world":8,
 *            "state":"opening"|"staging"|"writing"|"waiting"|"committing",
 *            "ranks":[{"rank":0, "client":1 or null, "bytes":N,
 *                      "staged":N, "written":N, "durable":true|false}],
 *            "bytes":N, "staged":N, "written":N,
 *            "age_s":1.25, "write_gibps":1.9}],
 *  "totals":{"saves_committed":3, "saves_failed":1, "saves_refused":0,
 *            "bytes_written":N},
 *  "max_loop_stall_ms":2.5,   the longest round of the event loop so far
 *                             (time away from its wait)
 *  "max_loop_cpu_ms":1.2,     the most CPU time it used in one round (a
 *                             stall far above it: waiting for a CPU)
 *  "all_users":false}         false: only the asking user's clients and
 *                             saves are listed (root sees all)
 *
 * "waiting": every local rank is durable and the save waits for ranks on
 * other daemons (or, on such a daemon, for rank 0's daemon to commit).
 */
#ifndef CKPTD_STATUS_H
#define CKPTD_STATUS_H

#include <sys/types.h>

struct server;

/* Builds the report.  Returns 0 and a malloc'd NUL-terminated *ret_json, or
 * -ENOMEM. */
int status_report(struct server *srv, uid_t uid, char **ret_json);

#endif
