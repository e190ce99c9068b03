package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/agentproto"
	"computeplane/internal/ids"
	"computeplane/internal/notify"
	"computeplane/internal/pki"
	"computeplane/internal/store"
)

// What the rest of the control plane calls to give a node's daemon work:
// a new desired spec, a command, a revocation. Each writes in the
// caller's transaction and returns the topic to wake after commit
// (notify.Notifier.Wake), so the owning gateway sends at once.

// Topic is the wake-up topic of one gateway.
func Topic(gatewayID string) string { return "gateway/" + gatewayID }

// ResultTopic is woken once command id's result is written (and
// followed by OnResult): the calls waiting for it re-read at once.
func ResultTopic(commandID string) string { return "command/" + commandID }

// TopicAll wakes every gateway (a node out of session has none).
const TopicAll = "gateway/*"

func topicOf(gw pgtype.Text) string {
	if !gw.Valid || gw.String == "" {
		return TopicAll
	}
	return Topic(gw.String)
}

// PutSpec replaces a node's desired spec, raising its generation.
func PutSpec(ctx context.Context, tx pgx.Tx, nodeID string, body json.RawMessage) (generation int64, topic string, err error) {
	q := db.New(tx)
	n, err := q.GetNode(ctx, nodeID)
	if err != nil {
		return 0, "", fmt.Errorf("gateway: spec for node %s: %w", nodeID, err)
	}
	gen, err := q.PutNodeSpec(ctx, db.PutNodeSpecParams{NodeID: nodeID, Body: body})
	return gen, topicOf(n.Node.SessionGateway), err
}

// DefaultCommandTTL is how long a command waits for its daemon.
const DefaultCommandTTL = 10 * time.Minute

// ErrUnknownCommand refuses a kind the protocol does not know.
var ErrUnknownCommand = errors.New("gateway: unknown command kind")

// EnqueueCommand queues a command for a node's daemon; the gateway signs
// it when it sends it and the command sweeper re-sends it until its
// result arrives or ttl passes.
func EnqueueCommand(ctx context.Context, tx pgx.Tx, nodeID, kind string, args json.RawMessage, createdBy string, ttl time.Duration, now time.Time) (db.NodeCommand, string, error) {
	switch kind {
	case agentproto.CommandEcho, agentproto.CommandInventory, agentproto.CommandNotice,
		agentproto.CommandExec, agentproto.CommandReadFile, agentproto.CommandWriteFile,
		agentproto.CommandSnapshot, agentproto.CommandDeleteSnapshot:
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
		return db.NodeCommand{}, "", fmt.Errorf("gateway: command for node %s: %w", nodeID, err)
	}
	c, err := q.InsertCommand(ctx, db.InsertCommandParams{
		CommandID: ids.New("cmd"), NodeID: nodeID, Kind: kind, Args: args, CreatedBy: createdBy, ExpiresAt: now.Add(ttl),
	})
	return c, topicOf(n.Node.SessionGateway), err
}

// Revoke adds a node id or certificate serial to the revocation set;
// gateways close its sessions once TopicRevocations wakes them.
func Revoke(ctx context.Context, tx pgx.Tx, kind, value, reason string) error {
	if kind != RevokeNode && kind != RevokeSerial {
		return fmt.Errorf("gateway: revocation kind %q: use node or serial", kind)
	}
	_, err := db.New(tx).InsertRevocation(ctx, db.InsertRevocationParams{Kind: kind, Value: value, Reason: reason})
	return err
}

// RunRevokeCommand runs `computed pki revoke --node ID | --serial HEX
// [--reason R]`: the revocation is written and every gateway woken to close
// the sessions it names at once.
func RunRevokeCommand(ctx context.Context, st *store.Store, bundle func() (*pki.Bundle, error), args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("computed pki revoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	node := fs.String("node", "", "revoke every certificate of this node")
	serial := fs.String("serial", "", "revoke one certificate by its serial (hex)")
	reason := fs.String("reason", "", "why, kept with the revocation")
	if fs.Parse(args) != nil || (*node == "") == (*serial == "") {
		fmt.Fprintln(stderr, "usage: computed pki revoke --node ID | --serial HEX [--reason R]")
		return 2
	}
	kind, value := RevokeNode, *node
	if *serial != "" {
		kind, value = RevokeSerial, strings.ToLower(*serial)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := st.WithTx(ctx, false, func(ctx context.Context, tx pgx.Tx) error {
		if err := Revoke(ctx, tx, kind, value, *reason); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_notify($1, $2)", notify.Channel, TopicRevocations)
		return err
	})
	if err != nil {
		fmt.Fprintln(stderr, "computed pki revoke:", err)
		return 1
	}
	// Gateways with an internal API load the set at once; the others on
	// the NOTIFY above or within 5 s.
	if err := NewInternalClient(st, bundle, nil).PushRevocations(ctx); err != nil {
		fmt.Fprintln(stderr, "computed pki revoke: pushing to gateways:", err)
	}
	fmt.Fprintf(stdout, "revoked %s %s\n", kind, value)
	return 0
}
