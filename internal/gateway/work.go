package gateway

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"computeplane/gen/db"
	"computeplane/internal/nodework"
	"computeplane/internal/notify"
	"computeplane/internal/pki"
	"computeplane/internal/store"
)

// The work itself (specs, commands, what a status moves) is nodework's;
// a gateway carries it. Its wake-up topics:

// Topic is the wake-up topic of one gateway.
func Topic(gatewayID string) string { return nodework.GatewayTopic(gatewayID) }

// TopicAll wakes every gateway (a node out of session has none).
const TopicAll = nodework.TopicAll

func topicOf(gw pgtype.Text) string { return nodework.TopicOf(gw) }

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
