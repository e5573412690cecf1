/* SPDX-License-Identifier: MIT */
/*
 * main.c - ckptd: options, the listening socket, the event loop.
 *
 * Exit codes: 0 after a clean stop, 1 on a run-time failure, 2 on bad usage,
 * 78 (EX_CONFIG) on an invalid configuration -- found before anything starts.
 */
#include <errno.h>
#include <fcntl.h>
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
#include <sys/timerfd.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server.h"

#define EX_CONFIG_ 78
#define TICK_MS 50
#define SWEEP_EVERY_MS 60000
#define STOP_GRACE_MS 30000

static int listen_socket(struct server *srv)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	const char *path = srv->cfg.socket_path;
	int n = sd_listen_fds(1);
	int fd;

	if (n > 1) {
		log_err("systemd passed %d sockets; expected one", n);
		return -EINVAL;
	}
	if (n == 1) {
		fd = SD_LISTEN_FDS_START;
		if (sd_is_socket_unix(fd, SOCK_SEQPACKET, 1, NULL, 0) <= 0) {
			log_err("the socket systemd passed is not a listening SOCK_SEQPACKET Unix socket");
			return -EINVAL;
		}
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
	{
		int r = -errno;
		log_err("cannot bind '%s': %s", path, strerror(errno));
		close(fd);
		return r;
	}
bound:
	if (chmod(path, srv->cfg.socket_mode) < 0)
		log_warn("chmod '%s': %s", path, strerror(errno));
	if (listen(fd, 128) < 0) {
		int r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

static int add_ev(struct server *srv, int fd, struct ev *ev, enum ev_kind kind)
{
	struct epoll_event ee = { .events = EPOLLIN, .data.ptr = ev };
	ev->kind = kind;
	ev->ptr = srv;
	return epoll_ctl(srv->epfd, EPOLL_CTL_ADD, fd, &ee) < 0 ? -errno : 0;
}

static int setup(struct server *srv)
{
	struct itimerspec its = {
		.it_interval = { 0, TICK_MS * 1000000L },
		.it_value = { 0, TICK_MS * 1000000L },
	};
	sigset_t mask;
	int r;

	sigemptyset(&mask);
	sigaddset(&mask, SIGTERM);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGHUP);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* A file size limit (LimitFSIZE=) must fail the write with EFBIG and
	 * that save only, not kill the daemon. */
	signal(SIGXFSZ, SIG_IGN);

	if (pipe2(srv->apipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -errno;
	srv->epfd = epoll_create1(EPOLL_CLOEXEC);
	srv->sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
	srv->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (srv->epfd < 0 || srv->sigfd < 0 || srv->tfd < 0)
		return -errno;
	timerfd_settime(srv->tfd, 0, &its, NULL);
	srv->lfd = listen_socket(srv);
	if (srv->lfd < 0)
		return srv->lfd;
	if ((r = add_ev(srv, srv->lfd, &srv->ev_listen, EV_LISTEN)) < 0 ||
	    (r = add_ev(srv, srv->sigfd, &srv->ev_sig, EV_SIGNAL)) < 0 ||
	    (r = add_ev(srv, srv->tfd, &srv->ev_timer, EV_TIMER)) < 0 ||
	    (r = add_ev(srv, srv->apipe[0], &srv->ev_arena, EV_ARENA)) < 0)
		return r;
	return 0;
}

/* SIGTERM: take no new clients or saves, fail the saves that can no longer
 * be staged, and let the ones the daemon already owns commit. */
static void begin_stop(struct server *srv)
{
	struct list *p, *t;

	if (srv->stopping)
		return;
	srv->stopping = true;
	sd_notify(0, "STOPPING=1");
	log_info("stopping: finishing the saves already staged");
	epoll_ctl(srv->epfd, EPOLL_CTL_DEL, srv->lfd, NULL);
	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		bool staged = true;
		for (struct list *q = s->ranks.next; q != &s->ranks; q = q->next)
			staged &= list_entry(q, struct rank_save, slink)->staged;
		if (s->state == SAVE_ACTIVE && !staged)
			save_fail(s, -ESHUTDOWN, "ckptd is shutting down");
	}
}

static bool busy(struct server *srv)
{
	return !list_empty(&srv->saves) || srv->arenas_pending;
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
		for (int i = 0; i < n; i++) {
			struct ev *ev = evs[i].data.ptr;
			switch (ev->kind) {
			case EV_LISTEN:
				for (int k = 0; k < 64; k++)
					if (server_accept(srv) != 0 || srv->stopping)
						break;
				break;
			case EV_CLIENT:
				server_client_event(ev->ptr, evs[i].events);
				break;
			case EV_RING:
				writer_ring_event(ev->ptr);
				break;
			case EV_ARENA:
				server_arena_event(srv);
				break;
			case EV_SIGNAL: {
				struct signalfd_siginfo si;
				while (read(srv->sigfd, &si, sizeof(si)) == sizeof(si)) {
					if (si.ssi_signo == SIGHUP) {
						log_info("SIGHUP: reload is not supported; restart to "
							 "apply a new configuration");
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
				saves_tick(srv);
				/* A leftover becomes removable one deadline after its
				 * last change: sweep that often, at least every minute. */
				if (now_ms() - srv->last_sweep_ms >
				    (int64_t)(srv->cfg.commit_deadline_ms < SWEEP_EVERY_MS ?
						      srv->cfg.commit_deadline_ms :
						      SWEEP_EVERY_MS))
					sweep_roots(srv);
				break;
			}
			}
		}
		server_reap(srv);
		if (srv->stopping && (!busy(srv) || now_ms() > stop_at)) {
			if (busy(srv))
				log_warn("stop grace period over with saves still in flight");
			return 0;
		}
	}
}

static void teardown(struct server *srv)
{
	struct list *p, *t;
	int64_t until = now_ms() + STOP_GRACE_MS;

	/* Arena workers still hold their clients: wait for them (bounded). */
	while (srv->arenas_pending && now_ms() < until) {
		struct pollfd pfd = { .fd = srv->apipe[0], .events = POLLIN };
		if (poll(&pfd, 1, 100) > 0)
			server_arena_event(srv);
	}

	list_for_each_safe(p, t, &srv->clients)
	{
		struct client *c = list_entry(p, struct client, link);
		client_close(c, "daemon stopping");
	}
	list_for_each_safe(p, t, &srv->saves)
	{
		struct save *s = list_entry(p, struct save, link);
		save_fail(s, -ESHUTDOWN, "ckptd stopped before the save committed");
	}
	/* Writes still in flight complete or are cancelled when the rings go;
	 * the kernel keeps the pages until then. */
	list_for_each_safe(p, t, &srv->clients)
	{
		struct client *c = list_entry(p, struct client, link);
		c->ring_inflight = 0;
		c->slots_held = 0;
		for (struct list *q = c->ranks.next; q != &c->ranks;) {
			struct rank_save *rs = list_entry(q, struct rank_save, clink);
			q = q->next;
			rs->inflight = rs->held = 0;
		}
	}
	server_reap(srv);
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

	list_init(&srv.clients);
	list_init(&srv.saves);
	srv.start_ms = now_ms();
	srv.euid_root = geteuid() == 0;
	{
		struct rlimit rl;
		if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
			srv.fsize_limit = (uint64_t)rl.rlim_cur;
	}
	r = setup(&srv);
	if (r < 0) {
		log_err("start-up failed: %s", strerror(-r));
		return 1;
	}
	sweep_roots(&srv);
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
