package agentproto

import (
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fullSpec sets every field protocol 1 defines.
func fullSpec() Spec {
	return Spec{Generation: 7, Body: SpecBody{
		Instances: []InstanceSpec{
			{ID: "inst_a", State: StateRunning, Hostname: "web-1", VCPU: 2, MemoryMiB: 1024, DiskGiB: 10,
				Boot:     Boot{Format: "qcow2", Location: "https://images.example/web.qcow2", SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
				UserData: "#!/bin/sh\necho hi", Reboots: 1},
			{ID: "inst_b", State: StatePaused, Hostname: "sbx-1", VCPU: 1, MemoryMiB: 512,
				Boot:     Boot{Format: "kernel+initrd", Location: "/images/vmlinuz", Initrd: "/images/initrd", Cmdline: "console=ttyS0"},
				Identity: &SpecIdentity{Generation: 3, Hostname: "sbx-1", MachineID: "0123456789abcdef0123456789abcdef", Env: map[string]string{"A": "1"}},
				Volumes:  []SpecVolume{{Serial: "vol1", MountPath: "/data", ReadOnly: true}}, MemoryFile: true, Restore: "snap_1"},
			{ID: "inst_c", State: StateDeleted, Hostname: "old", VCPU: 1, MemoryMiB: 128, DiskGiB: 1},
		},
		Volumes: []VolumeSpec{{Serial: "vol1", SizeGiB: 2}},
	}}
}

// withNetworks gives fullSpec's instances the networks of issue 23: an
// egress VM with a policy, a private one, one with none.
func withNetworks(s Spec) Spec {
	s.Body.Instances[0].Network = &VMNetwork{Mode: NetEgress, Tenant: "acme", MAC: "02:1a:2b:3c:4d:5e",
		Address: netip.MustParsePrefix("10.200.3.7/24"), Gateway: netip.MustParseAddr("10.200.3.1"),
		DNS: []netip.Addr{netip.MustParseAddr("10.0.0.53")}, MTU: 1450,
		Policy: EgressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")},
			Deny: []netip.Prefix{netip.MustParsePrefix("198.51.100.7/32")}, AllowDomains: []string{"pypi.org"}}}
	s.Body.Instances[1].Network = &VMNetwork{Mode: NetPrivate, Tenant: "acme", MAC: "02:00:00:00:00:02",
		Address: netip.MustParsePrefix("10.201.0.2/24"), NetworkID: "pnet_1"}
	s.Body.Instances[2].Network = &VMNetwork{Mode: NetNone}
	s.Body.Networks = []NetworkSpec{{ID: "pnet_1", Tenant: "acme", VNI: 0x0ac900,
		Peers: []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")}}}
	return s
}

// What the control plane sends is what the daemon reads.
func TestSpecRoundTrip(t *testing.T) {
	sent := withNetworks(fullSpec())
	b, err := json.Marshal(Message{Type: TypeSpec, Spec: &sent})
	require.NoError(t, err)
	m, err := Decode(b)
	require.NoError(t, err)
	assert.Equal(t, sent, *m.Spec)
	require.NoError(t, m.Spec.Body.Validate())

	// Volumes: an empty list (delete every file) stays apart from none (a
	// control plane that does not speak of volumes).
	for _, vols := range [][]VolumeSpec{nil, {}} {
		b, _ := json.Marshal(SpecBody{Volumes: vols})
		var got SpecBody
		require.NoError(t, json.Unmarshal(b, &got))
		assert.Equal(t, vols == nil, got.Volumes == nil, string(b))
	}
}

// A spec as protocol-1 control planes have sent it since volumes and
// sandboxes (testdata/spec-v1.json) stays readable.
func TestSpecFromAnOlderControlPlane(t *testing.T) {
	b, err := os.ReadFile("testdata/spec-v1.json")
	require.NoError(t, err)
	m, err := Decode(b)
	require.NoError(t, err)
	assert.Equal(t, fullSpec(), *m.Spec)
	// Before volumes, a body had no volumes key: the store is left alone.
	m, err = Decode([]byte(`{"type":"spec","spec":{"generation":1,"body":{"instances":[{"id":"i","state":"running"}]}}}`))
	require.NoError(t, err)
	assert.Nil(t, m.Spec.Body.Volumes)
	assert.Equal(t, []InstanceSpec{{ID: "i", State: StateRunning}}, m.Spec.Body.Instances)
}

// v1Instance is how a protocol-1 daemon read an instance (its runtime's
// VMSpec before the spec was typed here); v1Body its volumes. Frozen:
// change them never, add a v2 beside them.
type v1Instance struct {
	ID        string `json:"id"`
	State     string `json:"state"`
	Hostname  string `json:"hostname"`
	VCPU      int    `json:"vcpu"`
	MemoryMiB int    `json:"memoryMiB"`
	DiskGiB   int64  `json:"diskGiB"`
	Boot      struct {
		Format   string `json:"format"`
		Location string `json:"location"`
		Initrd   string `json:"initrd"`
		Cmdline  string `json:"cmdline"`
	} `json:"boot"`
	UserData string `json:"userData,omitempty"`
	Reboots  int    `json:"reboots"`
	Identity *struct {
		Generation int64             `json:"generation"`
		Hostname   string            `json:"hostname"`
		MachineID  string            `json:"machineId"`
		Env        map[string]string `json:"env,omitempty"`
	} `json:"identity,omitempty"`
	Volumes []struct {
		Serial    string `json:"serial"`
		MountPath string `json:"mountPath"`
		ReadOnly  bool   `json:"readOnly,omitempty"`
	} `json:"volumes,omitempty"`
	MemoryFile bool   `json:"memoryFile,omitempty"`
	Restore    string `json:"restore,omitempty"`
}

type v1Body struct {
	Instances []json.RawMessage `json:"instances"`
	Volumes   *[]struct {
		Serial  string `json:"serial"`
		SizeGiB int64  `json:"sizeGiB"`
	} `json:"volumes"`
}

// What this build sends, reserved fields included, a protocol-1 daemon
// reads whole: every field it knows has the value sent.
func TestSpecReadByAnOlderDaemon(t *testing.T) {
	sent := withNetworks(fullSpec())
	sent.Body.Tunnels = []TunnelSpec{{ID: "tun_1"}}
	b, err := json.Marshal(Message{Type: TypeSpec, Spec: &sent})
	require.NoError(t, err)
	var msg struct {
		Type string `json:"type"`
		Spec struct {
			Generation int64           `json:"generation"`
			Body       json.RawMessage `json:"body"`
		} `json:"spec"`
	}
	require.NoError(t, json.Unmarshal(b, &msg))
	assert.Equal(t, TypeSpec, msg.Type)
	assert.Equal(t, sent.Generation, msg.Spec.Generation)
	var body v1Body
	require.NoError(t, json.Unmarshal(msg.Spec.Body, &body))
	require.NotNil(t, body.Volumes)
	require.Len(t, *body.Volumes, 1)
	assert.Equal(t, "vol1", (*body.Volumes)[0].Serial)
	assert.EqualValues(t, 2, (*body.Volumes)[0].SizeGiB)
	require.Len(t, body.Instances, len(sent.Body.Instances))
	for i, raw := range body.Instances {
		var old v1Instance
		require.NoError(t, json.Unmarshal(raw, &old))
		// Back through JSON into this build's type: nothing was lost.
		ob, err := json.Marshal(old)
		require.NoError(t, err)
		var back InstanceSpec
		require.NoError(t, json.Unmarshal(ob, &back))
		want := sent.Body.Instances[i]
		want.Boot.SHA256 = "" // the old daemon never read it
		want.Network = nil    // nor networks: its VMs have none, as before
		assert.Equal(t, want, back, "instance %d", i)
	}
}

func FuzzSpecValidate(f *testing.F) {
	f.Add([]byte(`{"instances":[{"id":"a","state":"running","vcpu":2}]}`))
	f.Add([]byte(`{"instances":[{"id":"a","state":"running"},{"id":"a","state":"paused"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var s SpecBody
		if json.Unmarshal(body, &s) != nil || s.Validate() != nil {
			return
		}
		seen := map[string]bool{}
		for _, in := range s.Instances {
			require.NotEmpty(t, in.ID)
			require.False(t, seen[in.ID])
			seen[in.ID] = true
			require.True(t, strings.Contains("running stopped paused deleted", in.State))
		}
	})
}

func TestSpecValidateRefuses(t *testing.T) {
	for _, in := range [][]InstanceSpec{
		{{ID: "", State: StateRunning}},
		{{ID: strings.Repeat("x", 129), State: StateRunning}},
		{{ID: "a", State: StateRunning}, {ID: "a", State: StatePaused}},
		{{ID: "a", State: "flying"}},
		{{ID: "a", State: StateRunning, Network: &VMNetwork{Mode: "bridged"}}},
		make([]InstanceSpec, MaxInstances+1),
	} {
		assert.Error(t, SpecBody{Instances: in}.Validate())
	}
	peer := netip.MustParseAddr("192.0.2.10")
	for _, nets := range [][]NetworkSpec{
		{{ID: "", VNI: 1}},
		{{ID: "pnet_1", VNI: 0}},
		{{ID: "pnet_1", VNI: MaxVNI + 1}},
		{{ID: "pnet_1", VNI: 1}, {ID: "pnet_1", VNI: 2}},
		{{ID: "pnet_1", VNI: 1, Peers: []netip.Addr{peer, {}}}},
	} {
		assert.Error(t, SpecBody{Networks: nets}.Validate(), "%+v", nets)
	}
	assert.NoError(t, SpecBody{Networks: []NetworkSpec{{ID: "pnet_1", VNI: MaxVNI, Peers: []netip.Addr{peer}}}}.Validate())
}

// A hello's network capability: none is always offered; an inventory
// from a daemon before networks offers nothing else and has no underlay.
func TestInventoryOffersNetworks(t *testing.T) {
	var old Inventory
	require.NoError(t, json.Unmarshal([]byte(`{"hostname":"h","vcpu":2,"runtime":"qemu"}`), &old))
	assert.True(t, old.Offers(NetNone))
	assert.False(t, old.Offers(NetEgress))
	assert.False(t, old.Offers(NetPrivate))
	assert.False(t, old.Underlay.IsValid())
	b, _ := json.Marshal(old)
	assert.NotContains(t, string(b), "underlay")
	assert.NotContains(t, string(b), "networks")

	inv := Inventory{Networks: []string{NetEgress, NetPrivate}, Underlay: netip.MustParseAddr("192.0.2.1")}
	b, err := json.Marshal(inv)
	require.NoError(t, err)
	var got Inventory
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, inv, got)
	assert.True(t, got.Offers(NetPrivate))
}

// A status with egress counters round-trips; one from an older daemon
// (no counters) reads as zero, and an older control plane ignores them.
func TestStatusEgressCounters(t *testing.T) {
	sent := InstanceStatus{ID: "inst_a", State: StateRunning, EgressTxBytes: 1 << 40, EgressRxBytes: 12345}
	b, err := json.Marshal(sent)
	require.NoError(t, err)
	var got InstanceStatus
	require.NoError(t, json.Unmarshal(b, &got))
	assert.Equal(t, sent, got)
	var old struct {
		ID, State string
	}
	require.NoError(t, json.Unmarshal(b, &old))
	assert.Equal(t, "inst_a", old.ID)
	got = InstanceStatus{}
	require.NoError(t, json.Unmarshal([]byte(`{"id":"inst_a","state":"running"}`), &got))
	assert.Zero(t, got.EgressTxBytes+got.EgressRxBytes)
	b, _ = json.Marshal(InstanceStatus{ID: "i", State: StateRunning})
	assert.NotContains(t, string(b), "egress")
}
