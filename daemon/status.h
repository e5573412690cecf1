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
 *            "max_clients_per_uid":64, "arena_per_uid":N},
 *  "arena_bytes_total":N,                 bytes of all arenas now
 *  "users":[{"uid":1000, "connections":3, "arena_bytes":N, "pool_bytes":N,
 *            "resident_bytes":N}]: what each user holds (users.h; arena
 *            and pool bytes count against arena_per_uid)
 *  "connections_evicted":N,   idle connections closed to admit another
 *                             user's when max_clients was reached
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
 *  "last_commit":{"root":"/data", "name":"step-100", "job":"j", "step":100,
 *                 "bytes":N, "age_s":12.5} or null: the newest save committed
 *                 through this daemon that the asker may see (their own; root:
 *                 anyone's); bytes of a root that are not printable ASCII: '?'
 *  "metrics":{"listen":"127.0.0.1:9464" or null (as bound: port 0 resolved),
 *             "textfile":"/path" or null},
 *  "retention":{"removed":N, "errors":N}: checkpoints the daemon's retention
 *             passes removed, or failed to remove (retention.h); the
 *             policies are in "config": "retention":[{"root", "policy"}],
 *             "retention_sweep_s"
 *  "max_loop_stall_ms":2.5,   the longest round of the event loop so far
 *                             (time away from its wait)
 *  "max_loop_cpu_ms":1.2,     the most CPU time it used in one round (a
 *                             stall far above it: waiting for a CPU)
 *  "all_users":false,         false: only the asking user's clients and
 *                             saves are listed (root sees all)
 *  "s3":{"endpoint":"https://s3.eu-west-1.amazonaws.com", "region":"eu-west-1",
 *        "parts_in_flight_max":16, "requests":N, "retries":N, "failures":N,
 *        "bytes_up":N, "bytes_down":N, "parts_done":N, "in_flight":3,
 *        "queued":0, "up_bytes_per_s":N, "rate_window_s":10.0}}
 *
 * "s3" is there only when the daemon's S3 client is started.  Its counters
 * are the client's since start-up (all users' uploads: they tell the node's
 * link, not a job); "up_bytes_per_s" is bytes_up over the last
 * "rate_window_s" seconds (status_tick() samples it; 0 right after
 * start-up).  The endpoint is shown without any user:password part, and no
 * credential is ever in the report.  A save to an s3:// root also has
 * "s3_uploaded": its bytes whose parts (or PUTs) S3 has acknowledged, as
 * its ranks' "written" count them for such a root (an extent counts once
 * acknowledged and checksummed: a part in flight counts nothing).
 *
 * "waiting": every local rank is durable and the save waits for ranks on
 * other daemons (or, on such a daemon, for rank 0's daemon to commit).
 *
 * A save owed a commit (a rank of it spilled: save.h) also has
 * "pending":{"resumed":false, "tries":N, "last_error":"..." or null,
 *            "last_error_age_s":x or null, "next_try_s":x or null}:
 * resumed from an earlier life's records; how many of its steps met the
 * store failing, the last reason and how long ago, and when the next try
 * starts (null: not waiting).  Its ranks then have "client":null once
 * their clients are gone (always, when resumed).
 */
#ifndef CKPTD_STATUS_H
#define CKPTD_STATUS_H

#include <stdint.h>
#include <sys/types.h>

struct server;

/* Samples of the S3 client's bytes_up, one per STATUS_RATE_EVERY_MS, the
 * newest STATUS_RATE_SAMPLES of them: the upload rate is taken from the
 * oldest one held to the report's moment, so over about
 * (STATUS_RATE_SAMPLES - 1) * STATUS_RATE_EVERY_MS (10 s).  The loop's
 * alone. */
#define STATUS_RATE_EVERY_MS 1000
#define STATUS_RATE_SAMPLES 11
struct status_rate {
	int64_t t_ms[STATUS_RATE_SAMPLES];
	uint64_t bytes[STATUS_RATE_SAMPLES];
	unsigned next, n;          /* next slot to fill; samples held */
};

/* [loop] Called on every tick of the loop's timer: takes a sample when one
 * is due (cheap: a few atomic loads).  Does nothing without S3. */
void status_tick(struct server *srv);

/* Builds the report.  Returns 0 and a malloc'd NUL-terminated *ret_json, or
 * -ENOMEM. */
int status_report(struct server *srv, uid_t uid, char **ret_json);

#endif
