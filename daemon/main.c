/* SPDX-License-Identifier: MIT */
/*
 * main.c - ckptd: options, the listening socket, the event loop.
 *
 * Exit codes: 0 after a clean stop, 1 on a run-time failure, 2 on bad usage,
 * 78 (EX_CONFIG) on an invalid configuration -- found before anything starts.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <time.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/conn.h"
#include "daemon/log.h"
#include "daemon/metrics.h"
#include "daemon/resident.h"
#include "daemon/retention.h"
#include "daemon/save.h"
#include "daemon/server.h"
#include "daemon/share.h"
#include "daemon/testgate.h"
#include "store/fsutil.h"
#include "store/s3_addr.h"
#include "store/store_route.h"
#include "store/store_s3.h"
#include "store/store_spill.h"

#define EX_CONFIG_ 78
#define TICK_MS 50
#define SWEEP_EVERY_MS 60000
#define STOP_GRACE_MS 30000
#define WORKERS 4
#define ARENA_WORKERS 4
/* Checksums are due once a rank is staged, when its client no longer
 * copies; one thread keeps up with the disk here (ISA-L at 2-4 GiB/s on
 * cold bytes against a disk of about 2 GiB/s) and leaves the other CPU to
 * the clients still copying and to the loop.  It runs at a lower priority
 * (nice 10): where CPUs are short, a trainer's copy and the loop's answers
 * come first, and a commit waits a little longer instead. */
#define CRC_WORKERS 1
#define CRC_NICE 10
/* Uploads of spilled shards (the spill tier): each job reads its file and
 * hands parts to the S3 transport, which has the network concurrency; two
 * keep it fed while leaving the file-system workers to other saves. */
#define UPLOAD_WORKERS 2
/* Heartbeats of S3 saves: one small PUT and a HEAD each, every s3_heartbeat
 * per save; two threads keep them on time while S3 retries one. */
#define RENEW_WORKERS 2

static int listen_socket(struct server *srv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = srv->cfg.socket_path;
	/* Keep $LISTEN_FDS (0: do not unset): teardown asks sd_listen_fds()
	 * again to learn that the socket file is systemd's and must not be
	 * unlinked.  No child can mistake it for its own: ckptd execs nothing,
	 * and $LISTEN_PID names this process only. */
	int n = sd_listen_fds(0);
	int fd, r;

	if (n < 0) {
		log_err("the sockets passed by systemd are unusable: %s", strerror(-n));
		return n;
	}
	if (n > 1) {
		log_err("systemd passed %d sockets; expected one", n);
		return -EINVAL;
	}
	if (n == 1) {
		struct sockaddr_un bound = { 0 };
		socklen_t len = sizeof(bound);
		int flags;

		/* sd_listen_fds() has set FD_CLOEXEC; the socket must also be a
		 * listening SOCK_SEQPACKET one (a ListenStream= unit would pass
		 * a stream socket, and Accept=yes a connected one). */
		fd = SD_LISTEN_FDS_START;
		r = sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0);
		if (r <= 0) {
			log_err("the socket systemd passed (fd %d) is not a listening SOCK_SEQPACKET "
				"Unix socket%s%s",
				fd, r < 0 ? ": " : "", r < 0 ? strerror(-r) : "");
			return r < 0 ? r : -EINVAL;
		}
		/* Socket activation promises nothing about O_NONBLOCK (a
		 * socket from systemd-socket-activate is blocking), and the
		 * loop accepts until EAGAIN: on a blocking socket the accept4
		 * after the last pending connection would wait for the next
		 * one, with signals and every client stopped behind it.  The
		 * flag belongs to the open file, shared with the copy the
		 * activator keeps; it only polls that copy, so no harm. */
		flags = fcntl(fd, F_GETFL);
		if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
			r = -errno;
			log_err("making the socket passed by systemd non-blocking: %s", strerror(-r));
			return r;
		}
		/* Clients find the daemon through the configuration's `socket`:
		 * say so when systemd's socket is elsewhere. */
		if (getsockname(fd, (struct sockaddr *)&bound, &len) == 0 &&
		    len > sizeof(sa_family_t) && bound.sun_path[0] != '\0' &&
		    strncmp(bound.sun_path, path, sizeof(bound.sun_path)) != 0)
			log_warn("the socket passed by systemd is '%.*s' but the configuration's "
				 "socket is '%s', where clients will look for it",
				 (int)sizeof(bound.sun_path), bound.sun_path, path);
		log_info("using the socket passed by systemd");
		return fd;
	}

	if (strlen(path) >= sizeof(sa.sun_path)) {
		log_err("socket path '%s' is too long", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		goto bound;
	if (errno == EADDRINUSE) {
		/* A socket file is there: if a daemon answers on it, refuse to
		 * steal it; if not, it is a stale leftover. */
		int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
		if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			close(probe);
			close(fd);
			log_err("another ckptd is listening on '%s'", path);
			return -EADDRINUSE;
		}
		if (probe >= 0)
			close(probe);
		unlink(path);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			goto bound;
	}
	r = -errno;
	log_err("cannot bind '%s': %s", path, strerror(-r));
	close(fd);
	return r;
bound:
	if (chmod(path, srv->cfg.socket_mode) < 0)
		log_warn("chmod '%s': %s", path, strerror(errno));
	if (listen(fd, 128) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

static int add_ev(struct server *srv, int fd, struct ev *ev, enum ev_kind kind, void *ptr)
{
	struct epoll_event ee = { .events = EPOLLIN, .data.ptr = ev };
	ev->kind = kind;
	ev->ptr = ptr;
	return epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0 ? -errno : 0;
}

/* The daemon's identity: stable across restarts of the same daemon (its
 * machine and its state directory), and a fresh instance id per start, so
 * that what an earlier life left behind is never taken for this one's. */
static int make_identity(struct server *srv)
{
	char buf[PATH_MAX + 64] = "";
	uint8_t rnd[16];
	char *mid = NULL;
	size_t len = 0;
	int n;

	if (fs_read_file_at(AT_FDCWD, "/etc/machine-id", 256, &mid, &len) < 0) {
		char host[256] = "";
		gethostname(host, sizeof(host) - 1);
		mid = strdup(host);
	}
	n = snprintf(buf, sizeof(buf), "%s\n%s", mid ? mid : "", srv->cfg.state_dir);
	free(mid);
	store_hash_hex(buf, (size_t)n, srv->self.id);
	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		return -EIO;
	for (int i = 0; i < 16; i++)
		snprintf(srv->self.instance + 2 * i, 3, "%02x", rnd[i]);
	return 0;
}

/* S3 is set up when a root is an s3:// one, or an endpoint is configured:
 * without credentials that is a configuration error, found at start-up
 * rather than at the first save. */
static int s3_setup(const struct config *cfg)
{
	struct store_s3_settings set = {
		.endpoint = cfg->s3_endpoint,
		.region = cfg->s3_region,
		.addressing = cfg->s3_addressing,
		.credentials_file = cfg->s3_credentials_file,
		.profile = cfg->s3_profile,
		.parts_in_flight = cfg->s3_parts_in_flight,
		.retries = cfg->s3_retries,
		.retries_set = true,
		.backoff_base_ms = cfg->s3_backoff_base_ms,
		.backoff_cap_ms = cfg->s3_backoff_cap_ms,
		.stall_ms = cfg->s3_stall_timeout_ms,
		.connect_timeout_ms = cfg->s3_connect_timeout_ms,
	};
	bool want = cfg->s3_endpoint != NULL;
	char err[512];
	int r;

	for (size_t i = 0; i < cfg->n_roots; i++)
		want |= s3_is_url(cfg->roots[i]);
	if (!want)
		return 0;
	r = store_s3_start_settings(&set, err, sizeof(err));
	if (r < 0) {
		log_err("S3: %s", err);
		return -EBUSY; /* a configuration error: exit 78 */
	}
	const struct s3_conf *c = s3_client_conf(store_s3_client());
	log_info("S3: endpoint '%s', region '%s', %s addressing, %u parts in flight", c->endpoint,
		 c->region, c->virtual_host ? "virtual-host" : "path", c->parts_in_flight);
	return 0;
}

static int setup(struct server *srv)
{
	struct itimerspec its = {
		.it_interval = { 0, TICK_MS * 1000000L },
		.it_value = { 0, TICK_MS * 1000000L },
	};
	char err[512];
	sigset_t mask;
	int r;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigaddset(&mask, SIGUSR1);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* A file size limit (LimitFSIZE=) must fail the write with EFBIG and
	 * that save only, not kill the daemon. */
	signal(SIGXFSZ, SIG_IGN);

	srv->store = &store_routed;
	srv->store->set_disk_depth(srv->cfg.disk_depth);
	r = s3_setup(&srv->cfg);
	if (r < 0)
		return r;
	if (srv->cfg.s3_spill_dir) {
		r = store_spill_start(srv->cfg.s3_spill_dir, srv->cfg.s3_spill_keep, err,
				      sizeof(err));
		if (r < 0) {
			log_err("spill tier: %s", err);
			return -EBUSY; /* a configuration error: exit 78 */
		}
		log_info("spill tier: S3 saves go through '%s' (keeping %u per root)",
			 srv->cfg.s3_spill_dir, srv->cfg.s3_spill_keep);
	}
	creds_init();
	creds_self(&srv->creds);
	r = registry_open(&srv->reg, srv->cfg.state_dir, err, sizeof(err));
	/* The default state directory is the system's (under systemd the unit
	 * makes it for the ckptd user).  A daemon run by a plain user without
	 * one (a developer's ckptd -r DIR -s SOCK) keeps its state in that
	 * user's own state directory instead. */
	if ((r == -EACCES || r == -EROFS || r == -EPERM) && geteuid() != 0 &&
	    !strcmp(srv->cfg.state_dir, CONFIG_DEFAULT_STATE_DIR)) {
		const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
		char path[PATH_MAX];
		int n = xdg && xdg[0] == '/' ? snprintf(path, sizeof(path), "%s/ckptd", xdg) :
			home && home[0] == '/' ?
						      snprintf(path, sizeof(path), "%s/.local/state/ckptd", home) :
						      -1;
		char *copy = n > 0 && n < (int)sizeof(path) ? strdup(path) : NULL;
		if (copy) {
			free(srv->cfg.state_dir);
			srv->cfg.state_dir = copy;
			log_info("%s; keeping state in '%s' instead (set state_dir to choose)", err,
				 copy);
			r = registry_open(&srv->reg, srv->cfg.state_dir, err, sizeof(err));
		}
	}
	if (r < 0) {
		log_err("%s", err);
		return r;
	}
	r = make_identity(srv);
	if (r < 0)
		return r;
	srv->epfd = epoll_create1(EPOLL_CLOEXEC);
	srv->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	srv->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (srv->epfd < 0 || srv->sigfd < 0 || srv->tfd < 0)
		return -errno;
	timerfd_settime(srv->tfd, 0, &its, NULL);
	/* Worker threads start before the socket: a client never waits for
	 * them.  They block the signals above (inherited mask). */
	r = workers_start(&srv->work, WORKERS, 0);
	if (r < 0)
		return r;
	r = workers_start(&srv->arenas, ARENA_WORKERS, 0);
	if (r < 0)
		return r;
	r = workers_start(&srv->crcs, CRC_WORKERS, CRC_NICE);
	if (r < 0)
		return r;
	r = workers_start(&srv->uploads, UPLOAD_WORKERS, 0);
	if (r < 0)
		return r;
	/* Ranged GETs for loads block on the network: as many at once as the
	 * uploads' parts in flight. */
	if (store_s3_client()) {
		unsigned n = srv->cfg.s3_parts_in_flight < 16 ? srv->cfg.s3_parts_in_flight : 16;
		r = workers_start(&srv->s3_reads, n, 0);
		if (r == 0)
			r = add_ev(srv, srv->s3_reads.efd, &srv->ev_s3_reads, EV_WORK,
				   &srv->s3_reads);
		if (r == 0)
			r = workers_start(&srv->renewals, RENEW_WORKERS, 0);
		if (r == 0)
			r = add_ev(srv, srv->renewals.efd, &srv->ev_renewals, EV_WORK,
				   &srv->renewals);
		if (r < 0)
			return r;
	}
	r = metrics_start(srv);
	if (r < 0)
		return r;
	r = retention_start(srv);
	if (r == 0 && srv->retention)
		r = add_ev(srv, srv->prunes.efd, &srv->ev_prunes, EV_WORK, &srv->prunes);
	if (r < 0)
		return r;
	srv->lfd = listen_socket(srv);
	if (srv->lfd < 0)
		return srv->lfd;
	if ((r = add_ev(srv, srv->lfd, &srv->ev_listen, EV_LISTEN, srv)) < 0 ||
	    (r = add_ev(srv, srv->sigfd, &srv->ev_sig, EV_SIGNAL, srv)) < 0 ||
	    (r = add_ev(srv, srv->tfd, &srv->ev_timer, EV_TIMER, srv)) < 0 ||
	    (r = add_ev(srv, srv->work.efd, &srv->ev_work, EV_WORK, &srv->work)) < 0 ||
	    (r = add_ev(srv, srv->arenas.efd, &srv->ev_arenas, EV_WORK, &srv->arenas)) < 0 ||
	    (r = add_ev(srv, srv->crcs.efd, &srv->ev_crcs, EV_WORK, &srv->crcs)) < 0 ||
	    (r = add_ev(srv, srv->uploads.efd, &srv->ev_uploads, EV_WORK, &srv->uploads)) < 0)
		return r;
	return 0;
}

/* ---- the sweep: on a worker, as the daemon ---- */

struct sweep_job {
	struct work w;
	struct server *srv;     /* read in done() only (the loop) */
	struct registry *reg;
	char instance[STORE_ID_LEN + 1];
	int64_t min_age_ms, idle_ms;
	size_t n_live;
	char live[][STORE_ID_LEN + 1];
};

static void sweep_run(struct work *w)
{
	struct sweep_job *j = (struct sweep_job *)w;

	registry_sweep(j->reg, j->instance, j->min_age_ms, j->idle_ms, j->live, j->n_live);
}

static void sweep_done(struct work *w)
{
	struct sweep_job *j = (struct sweep_job *)w;

	j->srv->sweeping = false;
	free(j);
}

/* Starts a sweep of the work areas this daemon noted (registry.h), unless
 * one is running. */
static void sweep_start(struct server *srv)
{
	struct list *p;
	size_t n = 0;
	struct sweep_job *j;

	if (srv->sweeping)
		return;
	list_for_each(p, &srv->saves)
		n++;
	j = calloc(1, sizeof(*j) + (n + 1) * sizeof(j->live[0]));
	if (!j)
		return;
	j->w.run = sweep_run;
	j->w.done = sweep_done;
	j->srv = srv;
	j->reg = &srv->reg;
	memcpy(j->instance, srv->self.instance, sizeof(j->instance));
	j->min_age_ms = (int64_t)srv->cfg.commit_deadline_ms;
	/* An S3 area another daemon still works in is renewed every
	 * s3_heartbeat: three missed ones, and at least a deadline, before
	 * it counts as dead. */
	j->idle_ms = j->min_age_ms;
	if ((int64_t)srv->cfg.s3_heartbeat_ms * 3 > j->idle_ms)
		j->idle_ms = (int64_t)srv->cfg.s3_heartbeat_ms * 3;
	j->n_live = saves_live_ids(srv, j->live, n);
	srv->sweeping = true;
	srv->last_sweep_ms = now_ms();
	workers_submit(&srv->work, &j->w);
}

/* SIGTERM: take no new clients or saves, fail the saves that can no longer
 * be staged, and let the ones the daemon already owns commit. */
static void begin_stop(struct server *srv)
{
	if (srv->stopping)
		return;
	srv->stopping = true;
	sd_notify(0, "STOPPING=1");
	log_info("stopping: finishing the saves already staged");
	epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->lfd, NULL);
	/* Our own socket goes now: a client (a trainer restarting, ckptctl
	 * status) learns at once that no ckptd listens, instead of waiting in
	 * the backlog of one that will never answer.  A socket systemd passed
	 * stays: the next instance answers what queues there. */
	if (srv->lfd >= 0 && sd_listen_fds(0) <= 0) {
		unlink(srv->cfg.socket_path);
		close(srv->lfd);
		srv->lfd = -1;
	}
	saves_stop(srv, false);
}

static bool busy(struct server *srv)
{
	return saves_busy(srv) || workers_in_flight(&srv->arenas);
}

static void reap(struct server *srv)
{
	saves_reap(srv);
	conns_reap(srv);
	share_reap(srv);
	metrics_reap(srv);
}

static int run(struct server *srv)
{
	struct epoll_event evs[64];
	int64_t stop_at = 0;

	for (;;) {
		int n = epoll_wait(srv->epfd, evs, 64, -1);

		if (n < 0 && errno != EINTR) {
			log_err("epoll_wait: %s", strerror(errno));
			return -errno;
		}
		int64_t t0 = now_us(), c0 = thread_cpu_us();
		for (int i = 0; i < n; i++) {
			struct ev *ev = evs[i].data.ptr;
			switch (ev->kind) {
			case EV_LISTEN:
				for (int k = 0; k < 64 && !srv->stopping; k++)
					if (conn_accept(srv) != 0)
						break;
				break;
			case EV_CONN:
				conn_event(ev->ptr, evs[i].events);
				break;
			case EV_IO:
				conn_io_event(ev->ptr);
				break;
			case EV_WORK:
				workers_complete(ev->ptr);
				break;
			case EV_POOL:
				share_io_event(ev->ptr);
				break;
			case EV_METRICS_LISTEN:
				metrics_listen_event(ev);
				break;
			case EV_METRICS_CONN:
				metrics_conn_event(ev, evs[i].events);
				break;
			case EV_SIGNAL: {
				struct signalfd_siginfo si;
				while (read(srv->sigfd, &si, sizeof(si)) == sizeof(si)) {
					if (si.ssi_signo == SIGHUP) {
						log_info("SIGHUP: reload is not supported; restart to "
							 "apply a new configuration");
						continue;
					}
					if (si.ssi_signo == SIGUSR1) {
						/* On demand: every known directory pruned
						 * now, in the background. */
						log_info("SIGUSR1: retention sweep%s", srv->retention ?
							 "" : ": no retention policy configured");
						retention_sweep_now(srv);
						continue;
					}
					if (srv->stopping) {
						log_warn("second signal: stopping now");
						return 0;
					}
					begin_stop(srv);
					stop_at = now_ms() + STOP_GRACE_MS;
				}
				break;
			}
			case EV_TIMER: {
				uint64_t ticks;
				if (read(srv->tfd, &ticks, sizeof(ticks)) < 0 && errno != EAGAIN)
					log_debug("timerfd: %s", strerror(errno));
				conns_tick(srv);
				share_tick(srv);
				saves_tick(srv);
				status_tick(srv);
				metrics_tick(srv);
				retention_tick(srv, now_ms());
				/* A leftover of this life becomes removable one
				 * deadline after it was made: sweep that often, at
				 * least every minute. */
				if (now_ms() - srv->last_sweep_ms >
				    (int64_t)(srv->cfg.commit_deadline_ms < SWEEP_EVERY_MS ?
						      srv->cfg.commit_deadline_ms :
						      SWEEP_EVERY_MS))
					sweep_start(srv);
				break;
			}
			}
		}
		reap(srv);
		int64_t spent = now_us() - t0, cpu = thread_cpu_us() - c0;
		if (cpu > srv->max_busy_us)
			srv->max_busy_us = cpu;
		if (spent > srv->max_stall_us) {
			srv->max_stall_us = spent;
			if (spent > 20000)
				log_debug("one round of the event loop took %.1f ms (%.1f ms of CPU)",
					  (double)spent / 1000.0, (double)cpu / 1000.0);
		}
		if (srv->stopping && (!busy(srv) || now_ms() > stop_at)) {
			if (busy(srv))
				log_warn("stop grace period over with saves still in flight");
			return 0;
		}
	}
}

/* Stops cleanly: every connection closes, every save still open fails
 * through the state machine (abort functions, not by zeroing counters), the
 * writes and jobs in flight finish (bounded), and the reapers free it all. */
static void teardown(struct server *srv)
{
	struct list *p, *t;
	int64_t until = now_ms() + STOP_GRACE_MS;

	list_for_each_safe(p, t, &srv->conns)
		conn_close(list_entry(p, struct conn, link), "daemon stopping");
	saves_stop(srv, true);
	while (now_ms() < until) {
		bool io = false;
		list_for_each(p, &srv->conns)
		{
			struct conn *c = list_entry(p, struct conn, link);
			if (c->io && srv->store->arena_busy(c->io)) {
				srv->store->arena_reap(c->io);
				io = true;
			}
		}
		if (share_busy(srv))
			io = true;
		workers_complete(&srv->crcs);
		workers_complete(&srv->work);
		workers_complete(&srv->arenas);
		workers_complete(&srv->uploads);
		if (srv->s3_reads.n)
			workers_complete(&srv->s3_reads);
		if (srv->renewals.n)
			workers_complete(&srv->renewals);
		reap(srv);
		if (!io && list_empty(&srv->saves) && list_empty(&srv->conns) &&
		    !workers_in_flight(&srv->crcs) && !workers_in_flight(&srv->work) &&
		    !workers_in_flight(&srv->arenas) && !workers_in_flight(&srv->uploads) &&
		    !(srv->s3_reads.n && workers_in_flight(&srv->s3_reads)) &&
		    !(srv->renewals.n && workers_in_flight(&srv->renewals)))
			break;
		struct pollfd pfd[6] = { { .fd = srv->work.efd, .events = POLLIN },
					 { .fd = srv->arenas.efd, .events = POLLIN },
					 { .fd = srv->crcs.efd, .events = POLLIN },
					 { .fd = srv->uploads.efd, .events = POLLIN },
					 { .fd = srv->s3_reads.n ? srv->s3_reads.efd : -1,
					   .events = POLLIN },
					 { .fd = srv->renewals.n ? srv->renewals.efd : -1,
					   .events = POLLIN } };
		poll(pfd, 6, 10);
	}
	if (!list_empty(&srv->saves) || !list_empty(&srv->conns))
		log_warn("stopping with work still in flight");
	workers_stop(&srv->crcs); /* its done() may queue file-system jobs */
	workers_stop(&srv->work);
	workers_stop(&srv->arenas);
	workers_stop(&srv->uploads); /* cancelled by saves_stop: they end soon */
	retention_stop(srv); /* the pass in flight ends first */
	if (srv->s3_reads.n)
		workers_stop(&srv->s3_reads); /* no arena is freed before they end */
	if (srv->renewals.n)
		workers_stop(&srv->renewals);
	metrics_stop(srv); /* after the workers: a textfile job's done() ran */
	images_free_all(srv); /* no job is left that could copy into one */
	share_free_all(srv);
	share_reap(srv);
	store_spill_stop();
	store_s3_stop();
	registry_close(&srv->reg);
	if (srv->lfd >= 0 && sd_listen_fds(0) <= 0)
		unlink(srv->cfg.socket_path);
}

int main(int argc, char **argv)
{
	struct server srv = { .lfd = -1, .epfd = -1, .sigfd = -1, .tfd = -1 };
	struct config_args args;
	bool check_only;
	char err[1024];
	int r;

	r = config_args_parse(&args, argc, argv, err, sizeof(err));
	if (r < 0) {
		fprintf(stderr, "ckptd: %s\n", r == -ENOMEM ? strerror(ENOMEM) : err);
		if (r != -ENOMEM)
			config_usage(stderr);
		return r == -ENOMEM ? 1 : 2;
	}
	if (args.help || args.version) {
		if (args.help)
			config_usage(stdout);
		else
			printf("ckptd %s\n", CKPT_VERSION);
		config_args_free(&args);
		return 0;
	}
	if (args.verbose)
		log_set_level(LOG_DEBUG);
	check_only = args.check_only;
	r = config_from_args(&srv.cfg, &args, err, sizeof(err));
	config_args_free(&args);
	if (r < 0) {
		fprintf(stderr, "ckptd: invalid configuration: %s\n", err);
		return r == -ENOMEM ? 1 : EX_CONFIG_;
	}
	if (check_only) {
		printf("configuration is valid\n");
		config_free(&srv.cfg);
		return 0;
	}

	list_init(&srv.conns);
	list_init(&srv.saves);
	list_init(&srv.images);
	list_init(&srv.pools);
	list_init(&srv.dead_pools);
	list_init(&srv.s3_conns);
	srv.start_ms = now_ms();
	testgate_init();
	r = setup(&srv);
	if (r < 0) {
		log_err("start-up failed: %s", strerror(-r));
		/* The threads setup started stop before exit() runs the
		 * libraries' destructors under them. */
		struct workers *pools[] = { &srv.work, &srv.arenas, &srv.crcs, &srv.uploads,
					    &srv.s3_reads, &srv.renewals, &srv.prunes };
		for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++)
			if (pools[i]->n)
				workers_stop(pools[i]);
		metrics_stop(&srv);
		store_spill_stop();
		store_s3_stop();
		if (srv.reg.path) /* opened (a failed open leaves it NULL) */
			registry_close(&srv.reg);
		config_free(&srv.cfg);
		return r == -EBUSY ? EX_CONFIG_ : 1;
	}
	/* Saves an earlier life owes a commit (the spill tier) are live before
	 * the sweep looks: it passes their areas by.  What else earlier lives
	 * left behind goes first. */
	if (saves_resume(&srv))
		log_info("spill: resuming the saves an earlier life left durable on this node");
	sweep_start(&srv);
	log_info("ckptd %s ready on '%s' (%zu root%s, arena_max %llu MiB, deadline %llu ms)",
		 CKPT_VERSION, srv.cfg.socket_path, srv.cfg.n_roots, srv.cfg.n_roots == 1 ? "" : "s",
		 (unsigned long long)(srv.cfg.arena_max >> 20),
		 (unsigned long long)srv.cfg.commit_deadline_ms);
	sd_notify(0, "READY=1");

	r = run(&srv);
	teardown(&srv);
	log_info("stopped");
	config_free(&srv.cfg);
	return r < 0 ? 1 : 0;
}
