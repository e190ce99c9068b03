package redfish_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"computeplane/internal/drivers"
	"computeplane/internal/drivers/redfish"
)

// bmc is a Redfish service answering from recorded resources
// (testdata/bmc.json, shaped like the DMTF public-rackmount1 mockup) and
// applying the actions the driver sends to them.
type bmc struct {
	mu        sync.Mutex
	resources map[string]map[string]any
	requests  []string // METHOD path body, in order
}

const (
	system = "/redfish/v1/Systems/437XR1138R2"
	cd     = "/redfish/v1/Managers/BMC/VirtualMedia/CD1"
	usb    = "/redfish/v1/Managers/BMC/VirtualMedia/USB1"
)

func newBMC(t *testing.T) (*bmc, *httptest.Server) {
	t.Helper()
	raw, err := os.ReadFile("testdata/bmc.json")
	require.NoError(t, err)
	b := &bmc{}
	require.NoError(t, json.Unmarshal(raw, &b.resources))
	srv := httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(srv.Close)
	return b, srv
}

func (b *bmc) serve(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	// The service root is public (Redfish); everything else needs the
	// credential.
	if u, p, ok := r.BasicAuth(); path != "/redfish/v1" && (!ok || u != "admin" || p != "hunter2") {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	defer b.mu.Unlock()
	if r.Method != http.MethodGet {
		b.requests = append(b.requests, r.Method+" "+path+" "+strings.TrimSpace(string(body)))
	}
	var in map[string]any
	_ = json.Unmarshal(body, &in)
	switch {
	case r.Method == http.MethodGet:
		res, ok := b.resources[path]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(res)
		return
	case r.Method == http.MethodPost && path == system+"/Actions/ComputerSystem.Reset":
		switch in["ResetType"] {
		case "On", "ForceOn", "ForceRestart":
			b.resources[system]["PowerState"] = "On"
		case "ForceOff":
			b.resources[system]["PowerState"] = "Off"
		}
	case r.Method == http.MethodPatch && path == system:
		boot := b.resources[system]["Boot"].(map[string]any)
		for k, v := range in["Boot"].(map[string]any) {
			boot[k] = v
		}
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/Actions/VirtualMedia.InsertMedia"):
		vm := b.resources[strings.TrimSuffix(path, "/Actions/VirtualMedia.InsertMedia")]
		vm["Image"], vm["Inserted"] = in["Image"], true
	case r.Method == http.MethodPost && strings.HasSuffix(path, "/Actions/VirtualMedia.EjectMedia"):
		vm := b.resources[strings.TrimSuffix(path, "/Actions/VirtualMedia.EjectMedia")]
		vm["Image"], vm["Inserted"] = nil, false
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (b *bmc) sent() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.requests
	b.requests = nil
	return out
}

func open(t *testing.T, url string) drivers.Driver {
	t.Helper()
	t.Setenv("BMC_PASSWORD", "hunter2")
	raw, _ := json.Marshal(redfish.Config{Endpoint: url, Username: "admin", Password: "env://BMC_PASSWORD"})
	d, err := redfish.Open(context.Background(), raw)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func TestPowerBootAndMedia(t *testing.T) {
	b, srv := newBMC(t)
	d := open(t, srv.URL)
	ctx := t.Context()

	st, err := d.PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, drivers.PowerOff, st)
	require.NoError(t, d.Power(ctx, drivers.ActionOff), "off when off sends nothing")
	require.NoError(t, d.Power(ctx, drivers.ActionOn))
	require.NoError(t, d.Power(ctx, drivers.ActionOn), "on when on sends nothing")
	require.NoError(t, d.Power(ctx, drivers.ActionReset))
	st, err = d.PowerState(ctx)
	require.NoError(t, err)
	assert.Equal(t, drivers.PowerOn, st)
	assert.Equal(t, []string{
		`POST ` + system + `/Actions/ComputerSystem.Reset {"ResetType":"On"}`,
		`POST ` + system + `/Actions/ComputerSystem.Reset {"ResetType":"ForceRestart"}`,
	}, b.sent())

	require.NoError(t, d.SetBootDevice(ctx, drivers.BootCD, true))
	require.NoError(t, d.SetBootDevice(ctx, drivers.BootDisk, false))
	sent := b.sent()
	require.Len(t, sent, 2)
	assert.Contains(t, sent[0], `"BootSourceOverrideEnabled":"Once"`)
	assert.Contains(t, sent[0], `"BootSourceOverrideTarget":"Cd"`)
	assert.Contains(t, sent[1], `"BootSourceOverrideEnabled":"Continuous"`)
	assert.Contains(t, sent[1], `"BootSourceOverrideTarget":"Hdd"`)
	assert.Error(t, d.SetBootDevice(ctx, "floppy", false))

	agent := drivers.Media{Slot: drivers.SlotCD, Format: "iso", URL: "http://images.example/agent.iso"}
	require.NoError(t, d.InsertMedia(ctx, agent))
	require.NoError(t, d.InsertMedia(ctx, agent), "the same image again sends nothing")
	require.NoError(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotUSB, Format: "raw", URL: "http://images.example/os.raw"}))
	sent = b.sent()
	require.Len(t, sent, 2)
	assert.Contains(t, sent[0], "POST "+cd+"/Actions/VirtualMedia.InsertMedia")
	assert.Contains(t, sent[0], `"Image":"http://images.example/agent.iso"`)
	assert.Contains(t, sent[1], "POST "+usb+"/Actions/VirtualMedia.InsertMedia")

	// Another image in a full slot: ejected first.
	require.NoError(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotCD, Format: "iso", URL: "http://images.example/other.iso"}))
	sent = b.sent()
	require.Len(t, sent, 2)
	assert.Contains(t, sent[0], "POST "+cd+"/Actions/VirtualMedia.EjectMedia")
	assert.Contains(t, sent[1], "POST "+cd+"/Actions/VirtualMedia.InsertMedia")

	require.NoError(t, d.EjectMedia(ctx, drivers.SlotCD))
	require.NoError(t, d.EjectMedia(ctx, drivers.SlotCD), "an empty slot is left alone")
	assert.Len(t, b.sent(), 1)

	assert.Error(t, d.InsertMedia(ctx, drivers.Media{Slot: drivers.SlotCD, URL: "/local/path.iso"}), "a BMC fetches URLs only")
	assert.Error(t, d.InsertMedia(ctx, drivers.Media{Slot: "floppy", URL: "http://x/y"}))
	_, err = d.Agent(ctx)
	assert.ErrorIs(t, err, drivers.ErrUnsupported)
	_, err = d.Console(ctx, 100)
	assert.ErrorIs(t, err, drivers.ErrUnsupported)
}

func TestInventory(t *testing.T) {
	_, srv := newBMC(t)
	inv, err := open(t, srv.URL).Inventory(t.Context())
	require.NoError(t, err)
	assert.Equal(t, "Contoso", inv.Manufacturer)
	assert.Equal(t, "3500RX", inv.Model)
	assert.Equal(t, "437XR1138R2", inv.SerialNumber)
	assert.Equal(t, 16, inv.VCPU)
	assert.EqualValues(t, 96*1024, inv.MemoryMiB)
	assert.Equal(t, []drivers.NIC{{Name: "1", MAC: "12:44:6a:3b:04:11"}}, inv.NICs)
	require.Len(t, inv.Disks, 2)
	assert.EqualValues(t, 8000000000000, inv.Disks[0].SizeBytes)
	assert.Equal(t, drivers.PowerOff, inv.PowerState)
}

func TestConfig(t *testing.T) {
	_, srv := newBMC(t)
	for name, c := range map[string]redfish.Config{
		"a password value":   {Endpoint: srv.URL, Username: "admin", Password: "hunter2"},
		"an unset reference": {Endpoint: srv.URL, Username: "admin", Password: "env://NOT_SET_ANYWHERE"},
		"no URL":             {Endpoint: "bmc.example", Username: "admin"},
		"a wrong password":   {Endpoint: srv.URL, Username: "admin", Password: "env://WRONG_PASSWORD"},
		"an unknown system":  {Endpoint: srv.URL, Username: "admin", Password: "env://BMC_PASSWORD", SystemID: "nope"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("BMC_PASSWORD", "hunter2")
			t.Setenv("WRONG_PASSWORD", "hunter3")
			raw, _ := json.Marshal(c)
			_, err := redfish.Open(t.Context(), raw)
			assert.Error(t, err)
		})
	}
}
