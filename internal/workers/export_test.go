package workers

import "context"

// Kill stops the runner as SIGKILL would look to the others: its work ends
// but its leases are neither released nor its row deleted.
func (r *Runner) Kill() { r.halt(context.Background()) }

// Owner is the rendezvous choice among candidates.
var Owner = owner

// Backoff is the failure backoff.
var Backoff = backoff
