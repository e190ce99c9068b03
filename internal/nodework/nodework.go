// Package nodework owns the work the control plane gives a node's daemon
// and what comes back: the desired spec (node_specs, rebuilt whole by
// PushSpec), the command queue (node_commands, EnqueueCommand) and a
// Registry of status handlers, one per kind of instance, that each group
// fills with its own transitions, and of result handlers, one per kind of
// command. The gateway role only carries them: it sends what is pending
// and hands each status and each command result to the Registry.
//
// Each write is in the caller's transaction and names the topic to wake
// after commit (notify.Notifier.Wake), so the owning gateway sends at once.
package nodework

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/ids"
)

// GatewayTopic is the wake-up topic of one gateway.
func GatewayTopic(gatewayID string) string { return "gateway/" + gatewayID }

// TopicAll wakes every gateway (a node out of session has none).
const TopicAll = "gateway/*"

// ResultTopic is woken once command id's result is written and followed
// (Registry.ApplyResult): the calls waiting for it re-read at once.
func ResultTopic(commandID string) string { return "command/" + commandID }

// InstanceTopic is woken when a daemon's report moves instance id: its
// waits re-read.
func InstanceTopic(id string) string { return "instance/" + id }

// TopicOf is the topic of the gateway holding a node's session.
func TopicOf(sessionGateway pgtype.Text) string {
	if !sessionGateway.Valid || sessionGateway.String == "" {
		return TopicAll
	}
	return GatewayTopic(sessionGateway.String)
}

// PutSpec replaces a node's desired spec, raising its generation.
func PutSpec(ctx context.Context, tx pgx.Tx, nodeID string, body agentproto.SpecBody) (generation int64, topic string, err error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, "", err
	}
	q := db.New(tx)
	n, err := q.GetNode(ctx, nodeID)
	if err != nil {
		return 0, "", fmt.Errorf("nodework: spec for node %s: %w", nodeID, err)
	}
	gen, err := q.PutNodeSpec(ctx, db.PutNodeSpecParams{NodeID: nodeID, Body: b})
	return gen, TopicOf(n.Node.SessionGateway), err
}

// DefaultCommandTTL is how long a command waits for its daemon.
const DefaultCommandTTL = 10 * time.Minute

// ErrUnknownCommand refuses a kind the protocol does not know.
var ErrUnknownCommand = errors.New("nodework: unknown command kind")

// EnqueueCommand queues a command for a node's daemon; the gateway signs
// it when it sends it and the command sweeper re-sends it until its
// result arrives or ttl passes.
func EnqueueCommand(ctx context.Context, tx pgx.Tx, nodeID, kind string, args json.RawMessage, createdBy string, ttl time.Duration, now time.Time) (db.NodeCommand, string, error) {
	switch kind {
	case agentproto.CommandEcho, agentproto.CommandInventory, agentproto.CommandNotice,
		agentproto.CommandExec, agentproto.CommandReadFile, agentproto.CommandWriteFile, agentproto.CommandProcess,
		agentproto.CommandSnapshot, agentproto.CommandDeleteSnapshot,
		agentproto.CommandSupportBundle, agentproto.CommandUploadSupportBundle:
	default:
		return db.NodeCommand{}, "", fmt.Errorf("%w %q", ErrUnknownCommand, kind)
	}
	if args == nil {
		args = json.RawMessage("{}")
	}
	if ttl <= 0 {
		ttl = DefaultCommandTTL
	}
	q := db.New(tx)
	n, err := q.GetNode(ctx, nodeID)
	if err != nil {
		return db.NodeCommand{}, "", fmt.Errorf("nodework: command for node %s: %w", nodeID, err)
	}
	c, err := q.InsertCommand(ctx, db.InsertCommandParams{
		CommandID: ids.New("cmd"), NodeID: nodeID, Kind: kind, Args: args, CreatedBy: createdBy, ExpiresAt: now.Add(ttl),
	})
	return c, TopicOf(n.Node.SessionGateway), err
}
