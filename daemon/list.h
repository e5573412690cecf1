/* SPDX-License-Identifier: MIT */
/* list.h - an intrusive doubly linked list (the daemon's only container). */
#ifndef CKPTD_LIST_H
#define CKPTD_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct list {
	struct list *prev, *next;
};

#define list_entry(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
/* Iterates with `tmp` one step ahead, so `pos` may be removed. */
#define list_for_each_safe(pos, tmp, head)                                              \
	for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head);                  \
	     (pos) = (tmp), (tmp) = (pos)->next)
#define list_for_each(pos, head) for ((pos) = (head)->next; (pos) != (head); (pos) = (pos)->next)

static inline void list_init(struct list *l)
{
	l->prev = l->next = l;
}
static inline bool list_empty(const struct list *l)
{
	return l->next == l;
}
static inline void list_add_tail(struct list *head, struct list *n)
{
	n->prev = head->prev;
	n->next = head;
	head->prev->next = n;
	head->prev = n;
}
/* Unlinks n and leaves it as an empty list, so a second del is harmless. */
static inline void list_del(struct list *n)
{
	n->prev->next = n->next;
	n->next->prev = n->prev;
	list_init(n);
}

#endif
