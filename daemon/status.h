/* SPDX-License-Identifier: MIT */
/*
 * status.h - the daemon's status report, read by `ckptctl status`.
 *
 * The report is one JSON object, sent in a memfd (proto.h STATUS_REPLY):
 *
 * {"version":"0.1.0", "pid":123, "uptime_s":12.5,
 *  "config":{"socket":"/run/ckptd/ckptd.sock", "roots":["/data"],
 *            "arena_max":N, "arena_total":N, "uring_depth":16,
 *            "commit_deadline_ms":600000},
 *  "arena_bytes_total":N,                 bytes of all arenas now
 *  "clients":[{"id":1, "pid":456, "uid":1000, "job":"j", "rank":0,
 *              "world":8, "arena_bytes":N, "slot_bytes":N,
 *              "slots":256, "slots_in_use":3}],
 *  "saves":[{"job":"j", "name":"step-1", "root":"/data", "world":8,
 *            "state":"staging"|"writing"|"waiting",
 *            "ranks":[{"rank":0, "client":1 or null, "bytes":N,
 *                      "staged":N, "written":N, "durable":true|false}],
 *            "bytes":N, "staged":N, "written":N,
 *            "age_s":1.25, "write_gibps":1.9}],
 *  "totals":{"saves_committed":3, "saves_failed":1, "bytes_written":N}}
 *
 * "waiting": every local rank is durable and the save waits for ranks on
 * other daemons (or, on such a daemon, for rank 0's daemon to commit).
 */
#ifndef CKPTD_STATUS_H
#define CKPTD_STATUS_H

struct server;

/* Builds the report.  Returns 0 and a malloc'd NUL-terminated *ret_json, or
 * -ENOMEM. */
int status_report(struct server *srv, char **ret_json);

#endif
