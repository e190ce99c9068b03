package iam

import (
	"context"
	"log/slog"
	"time"
)

// InboxPoll is how often a process reads the identity inbox for events that
// invalidate its caches.
const InboxPoll = time.Second

// TopicInbox is the notifier topic an identity event's commit wakes
// (embedded writes it in the event's transaction): the inbox is drained at
// once instead of at the next poll.
const TopicInbox = "identity"

// React applies one identity event to the caches: a revoked credential or
// session is forgotten at once, so revocation does not wait out the 30 s
// credential cache; then the OnRevoke listeners hear it.
func (c *Cached) React(e Event) {
	if e.Session != "" {
		c.DropSession(e.Session)
		c.revoked(e.Session)
	}
	c.heard(e)
}

// DrainInbox reads the inbox until ctx ends and hands every event to react.
// Every process runs it for its own caches (no lease: each process must see
// every event). It starts after the events that exist when it starts, which
// no cache of this process can hold yet.
func DrainInbox(ctx context.Context, in Inbox, react func(Event), every time.Duration, log *slog.Logger) {
	DrainInboxWoken(ctx, in, react, every, nil, log)
}

// DrainInboxWoken is DrainInbox that also drains at once when wake
// delivers (the notifier's TopicInbox), so that an event reaches this
// process in milliseconds; every stays the bound when a wake is lost.
func DrainInboxWoken(ctx context.Context, in Inbox, react func(Event), every time.Duration, wake <-chan struct{}, log *slog.Logger) {
	FollowInbox(ctx, in, nil, react, every, wake, log)
}

// FollowInbox is DrainInboxWoken that calls start (when not nil) once it
// knows where the inbox ends and before it hands over the first event
// after that: a reconcile that start makes of the state the events
// describe misses none of them, the earlier ones being in what it reads.
func FollowInbox(ctx context.Context, in Inbox, start func(context.Context), react func(Event), every time.Duration, wake <-chan struct{}, log *slog.Logger) {
	after, err := latest(ctx, in)
	if err != nil {
		log.WarnContext(ctx, "identity inbox unreadable", "error", err.Error())
	}
	if start != nil {
		start(ctx)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for {
			events, err := in.Next(ctx, after, 500)
			if err != nil {
				if ctx.Err() == nil {
					log.WarnContext(ctx, "identity inbox unreadable", "error", err.Error())
				}
				break
			}
			for _, e := range events {
				react(e)
				after = e.ID
			}
			if len(events) < 500 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}

// latest is the id of the newest event in the inbox, "" when it is empty.
func latest(ctx context.Context, in Inbox) (string, error) {
	after := ""
	for {
		events, err := in.Next(ctx, after, 1000)
		if err != nil || len(events) == 0 {
			return after, err
		}
		after = events[len(events)-1].ID
	}
}
