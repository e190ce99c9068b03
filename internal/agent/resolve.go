package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"computeplane/internal/agentproto"
)

// ResolveRetry is how long the daemon waits for an answer to a Resolve
// before sending it again (the session may have ended meanwhile).
const ResolveRetry = 5 * time.Second

// setSender makes send the way to reach the gateway (nil: no session).
func (a *Agent) setSender(send func(agentproto.Message)) {
	a.rmu.Lock()
	a.rsend = send
	a.rmu.Unlock()
}

// resolved hands an answer to the Resolve waiting for it.
func (a *Agent) resolved(r *agentproto.Resolved) {
	a.rmu.Lock()
	ch := a.rwait[r.ID]
	a.rmu.Unlock()
	if ch != nil {
		select {
		case ch <- r:
		default:
		}
	}
}

// ResolveSecrets asks the gateway for the values of the secret references
// refs in the user data of instance id, over the session (waiting for one
// within ctx). The values stay in memory: the runtime hands them to the
// guest and writes them nowhere on the host.
func (a *Agent) ResolveSecrets(ctx context.Context, id string, refs []string) (map[string]string, error) {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	req := &agentproto.Resolve{ID: hex.EncodeToString(b), InstanceID: id, References: refs}
	ch := make(chan *agentproto.Resolved, 1)
	a.rmu.Lock()
	a.rwait[req.ID] = ch
	a.rmu.Unlock()
	defer func() {
		a.rmu.Lock()
		delete(a.rwait, req.ID)
		a.rmu.Unlock()
	}()
	for {
		a.rmu.Lock()
		send := a.rsend
		a.rmu.Unlock()
		wait := 100 * time.Millisecond // for a session
		if send != nil {
			send(agentproto.Message{Type: agentproto.TypeResolve, Resolve: req})
			wait = ResolveRetry
		}
		t := time.NewTimer(wait)
		select {
		case r := <-ch:
			t.Stop()
			if r.Error != "" {
				return nil, errors.New(r.Error)
			}
			for _, v := range r.Values {
				a.secrets.add(v)
			}
			return r.Values, nil
		case <-ctx.Done():
			t.Stop()
			return nil, errors.New("no answer from a gateway: " + ctx.Err().Error())
		case <-t.C:
		}
	}
}
