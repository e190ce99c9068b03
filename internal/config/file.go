package config

import (
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The file form of the configuration. Pointers tell "absent" from a zero
// value where a default applies. The yaml tags are the option names.

type fileConfig struct {
	Database        *string             `yaml:"database"`
	Secret          *string             `yaml:"secret"`
	BaseURL         *string             `yaml:"baseURL"`
	IAM             *fileIAM            `yaml:"iam"`
	RootTenantID    *string             `yaml:"rootTenantId"`
	BasePath        *string             `yaml:"basePath"`
	TypePrefix      *string             `yaml:"typePrefix"`
	Modules         []string            `yaml:"modules"`
	Plugins         []filePlugin        `yaml:"plugins"`
	Drivers         []string            `yaml:"drivers"`
	Providers       []string            `yaml:"providers"`
	Attestors       []string            `yaml:"attestors"`
	TPM             *fileTPM            `yaml:"tpm"`
	Cloud           *fileCloud          `yaml:"cloud"`
	Tunnels         *fileTunnels        `yaml:"tunnels"`
	PKI             *filePKI            `yaml:"pki"`
	Notifier        *fileNotifier       `yaml:"notifier"`
	Sinks           *fileSinks          `yaml:"sinks"`
	AcceptIAMCookie *bool               `yaml:"acceptIamCookie"`
	TrustedProxies  []string            `yaml:"trustedProxies"`
	Gateway         *fileGateway        `yaml:"gateway"`
	Downloads       *fileDownloads      `yaml:"downloads"`
	Images          *fileImages         `yaml:"images"`
	SupportBundles  *fileSupportBundles `yaml:"supportBundles"`
	ProviderDir     *string             `yaml:"providerDir"`
	Bootstrap       *fileBootstrap      `yaml:"bootstrap"`
	Secrets         *fileSecrets        `yaml:"secrets"`
	Webhooks        *fileWebhooks       `yaml:"webhooks"`
	Capacity        *fileCapacity       `yaml:"capacity"`
	Admission       *fileAdmission      `yaml:"admission"`
	Shutdown        *fileShutdown       `yaml:"shutdown"`
	Scheduler       *fileScheduler      `yaml:"scheduler"`
	Clock           *string             `yaml:"clock"`
	Log             *fileLog            `yaml:"log"`
	Workers         *fileWorkers        `yaml:"workers"`
	Metrics         *fileMetrics        `yaml:"metrics"`
	Host            *string             `yaml:"host"`
	Port            *int                `yaml:"port"`
	Roles           []string            `yaml:"roles"`
}

type fileTPM struct {
	EndorsementKeys []string `yaml:"endorsementKeys"`
}

type fileCloud struct {
	Audience *string           `yaml:"audience"`
	MaxAge   *string           `yaml:"maxAge"`
	Issuers  []fileCloudIssuer `yaml:"issuers"`
}

type fileCloudIssuer struct {
	Issuer   *string `yaml:"issuer"`
	JWKSURL  *string `yaml:"jwksUrl"`
	Provider *string `yaml:"provider"`
}

type fileIAM struct {
	Kind           *string                `yaml:"kind"`
	RootTenantID   *string                `yaml:"rootTenantId"`
	Events         *fileIAMEvents         `yaml:"events"`
	Decisions      *fileIAMDecisions      `yaml:"decisions"`
	Authentication *fileIAMAuthentication `yaml:"authentication"`
}

type fileIAMDecisions struct {
	SpiceDB *fileSpiceDB `yaml:"spicedb"`
}

type fileSpiceDB struct {
	Endpoint        *string `yaml:"endpoint"`
	PresharedKeyEnv *string `yaml:"presharedKeyEnv"`
	Plaintext       *bool   `yaml:"plaintext"`
	CAFile          *string `yaml:"caFile"`
	TimeoutMs       *int    `yaml:"timeoutMs"`
}

type fileIAMAuthentication struct {
	OIDC *fileOIDC `yaml:"oidc"`
}

type fileOIDC struct {
	Issuer      *string `yaml:"issuer"`
	Audience    *string `yaml:"audience"`
	TenantClaim *string `yaml:"tenantClaim"`
	CAFile      *string `yaml:"caFile"`
	TimeoutMs   *int    `yaml:"timeoutMs"`
}

type fileIAMEvents struct {
	Path   *string `yaml:"path"`
	Secret *string `yaml:"secret"`
}

type fileTunnels struct {
	Issuer         *string           `yaml:"issuer"`
	SSH            *bool             `yaml:"ssh"`
	SSHRequiresMFA *bool             `yaml:"sshRequiresMfa"`
	SSHAccounts    []string          `yaml:"sshAccounts"`
	PreviewDomain  *string           `yaml:"previewDomain"`
	Limits         *fileTunnelLimits `yaml:"limits"`
}

type fileTunnelLimits struct {
	TunnelsPerMinute       *int `yaml:"tunnelsPerMinute"`
	SSHCertificatesPerHour *int `yaml:"sshCertificatesPerHour"`
	OpenPerNode            *int `yaml:"openPerNode"`
	OpenPerGateway         *int `yaml:"openPerGateway"`
	IdleTimeoutMs          *int `yaml:"idleTimeoutMs"`
}

type filePKI struct {
	NodeCA              *fileKeyPair `yaml:"nodeCa"`
	ServingCA           *fileKeyPair `yaml:"servingCa"`
	Join                *fileKeyPair `yaml:"join"`
	CommandSigning      *fileKeyPair `yaml:"commandSigning"`
	CommandSigningRoots []filePEM    `yaml:"commandSigningRoots"`
	TrustVersion        *int         `yaml:"trustVersion"`
}

type fileKeyPair struct {
	Cert     *string `yaml:"cert"`
	CertFile *string `yaml:"certFile"`
	Key      *string `yaml:"key"`
	KeyFile  *string `yaml:"keyFile"`
}

type filePEM struct {
	PEM  *string `yaml:"pem"`
	File *string `yaml:"file"`
}

type fileNotifier struct {
	Kind *string `yaml:"kind"`
}

type filePlugin struct {
	ID      *string `yaml:"id"`
	Path    *string `yaml:"path"`
	SHA256  *string `yaml:"sha256"`
	DataDir *string `yaml:"dataDir"`
}

type fileSinks struct {
	Events []fileSink `yaml:"events"`
	Audit  []fileSink `yaml:"audit"`
	// Usage is here only to be refused with a reason.
	Usage *yaml.Node `yaml:"usage"`
}

type fileSink struct {
	ID   *string `yaml:"id"`
	Kind *string `yaml:"kind"`
	URL  *string `yaml:"url"`
	Path *string `yaml:"path"`
}

type fileGateway struct {
	URL            *string      `yaml:"url"`
	ServerName     *string      `yaml:"serverName"`
	Region         *string      `yaml:"region"`
	Listen         *string      `yaml:"listen"`
	InternalListen *string      `yaml:"internalListen"`
	TLS            *fileKeyPair `yaml:"tls"`
	MaxStreams     *int         `yaml:"maxStreams"`
	DrainDelayMs   *int         `yaml:"drainDelayMs"`
	DownAfterMs    *int         `yaml:"downAfterMs"`
	// SessionTicketDays: see Gateway.SessionTicketDays.
	SessionTicketDays *int `yaml:"sessionTicketDays"`
}

type fileDownloads struct {
	Dir  *string `yaml:"dir"`
	Blob *string `yaml:"blob"`
}

type fileImages struct {
	Dir *string `yaml:"dir"`
	URL *string `yaml:"url"`
}

type fileBootstrap struct {
	Agent   *string `yaml:"agent"`
	JoinURL *string `yaml:"joinUrl"`
}

type fileSupportBundles struct {
	Blob     *string `yaml:"blob"`
	MaxBytes *int64  `yaml:"maxBytes"`
}

type fileSecrets struct {
	Store *string `yaml:"store"`
}

type fileWebhooks struct {
	AllowPrivateTargets *bool `yaml:"allowPrivateTargets"`
	MaxPerTenant        *int  `yaml:"maxPerTenant"`
	AcceptAnyPattern    *bool `yaml:"acceptAnyPattern"`
}

type fileCapacity struct {
	Placer       *string `yaml:"placer"`
	MaxBatch     *int    `yaml:"maxBatch"`
	MaxAttempts  *int    `yaml:"maxAttempts"`
	RollupEvery  *string `yaml:"rollupEvery"`
	UsageEvery   *string `yaml:"usageEvery"`
	SpotNoticeMs *int64  `yaml:"spotNoticeMs"`
}

type fileScheduler struct {
	Plugins []string           `yaml:"plugins"`
	Weights map[string]float64 `yaml:"weights"`
	TopN    *int               `yaml:"topN"`
}

type fileLog struct {
	Level *string `yaml:"level"`
}

type fileWorkers struct {
	ID          *string `yaml:"id"`
	BatchSize   *int    `yaml:"batchSize"`
	Concurrency *int    `yaml:"concurrency"`
	PollMs      *int    `yaml:"pollMs"`
	ClaimTTLMs  *int    `yaml:"claimTtlMs"`
	ResyncMs    *int    `yaml:"resyncMs"`
}

type fileMetrics struct {
	Token *string `yaml:"token"`
	Path  *string `yaml:"path"`
}

// parseFile decodes a YAML or JSON document (JSON is YAML) into the file
// form. Unlike yaml.Decoder.KnownFields, which also refuses unknown keys,
// it walks the node tree itself so that every problem, a wrong type
// included, names the option by its path; it goes on past a problem, so
// that all of them are reported at once. A document that does not parse
// at all is one problem and no file form.
func parseFile(data []byte, p *problems) *fileConfig {
	var doc yaml.Node
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return &fileConfig{} // an empty file configures nothing
		}
		p.add(&Error{Option: EnvConfig, Message: "not valid YAML or JSON: " + strings.TrimPrefix(err.Error(), "yaml: ")})
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		p.add(&Error{Option: EnvConfig, Message: "holds more than one document"})
		return nil
	}
	fc := &fileConfig{}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return fc
		}
		root = root.Content[0]
	}
	if isNull(root) {
		return fc
	}
	if root.Kind != yaml.MappingNode {
		p.add(&Error{Option: EnvConfig, Message: "must hold an object of options"})
		return nil
	}
	decodeNode(root, reflect.ValueOf(fc).Elem(), "", p)
	return fc
}

var yamlNodeType = reflect.TypeFor[yaml.Node]()

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// decodeNode decodes n into v (addressable), strictly; each problem goes
// to p and leaves its option unset.
func decodeNode(n *yaml.Node, v reflect.Value, path string, p *problems) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if v.Type() == yamlNodeType {
		v.Set(reflect.ValueOf(*n))
		return
	}
	if isNull(n) {
		v.SetZero() // null is the same as absent
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		before := len(p.list)
		decodeNode(n, elem.Elem(), path, p)
		if len(p.list) == before || v.Type().Elem().Kind() == reflect.Struct {
			v.Set(elem) // an object keeps the options that decoded
		}
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			p.add(&Error{Option: path, Message: "must be an object"})
			return
		}
		fields := map[string]int{}
		for i := range v.NumField() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("yaml"), ",")
			fields[name] = i
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			opt := join(path, key)
			if n.Content[i].Kind != yaml.ScalarNode {
				p.add(&Error{Option: path, Message: "option names must be strings"})
				continue
			}
			idx, ok := fields[key]
			switch {
			case !ok:
				p.add(&Error{Option: opt, Message: "unknown option"})
			case seen[key]:
				p.add(&Error{Option: opt, Message: "given more than once"})
			default:
				seen[key] = true
				decodeNode(n.Content[i+1], v.Field(idx), opt, p)
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			p.add(&Error{Option: path, Message: "must be a list"})
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			decodeNode(item, s.Index(i), path+"["+strconv.Itoa(i)+"]", p)
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			p.add(&Error{Option: path, Message: "must be an object"})
			return
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key := n.Content[i].Value
			opt := join(path, key)
			if n.Content[i].Kind != yaml.ScalarNode {
				p.add(&Error{Option: path, Message: "keys must be strings"})
				continue
			}
			if m.MapIndex(reflect.ValueOf(key)).IsValid() {
				p.add(&Error{Option: opt, Message: "given more than once"})
				continue
			}
			elem := reflect.New(v.Type().Elem()).Elem()
			decodeNode(n.Content[i+1], elem, opt, p)
			m.SetMapIndex(reflect.ValueOf(key), elem)
		}
		v.Set(m)
	default:
		if err := decodeScalar(n, v, path); err != nil {
			p.add(err)
		}
	}
}

func decodeScalar(n *yaml.Node, v reflect.Value, path string) error {
	var want string
	switch v.Kind() {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "true or false"
	case reflect.Int, reflect.Int64:
		want = "an integer"
	case reflect.Float64:
		want = "a number"
	default:
		return &Error{Option: path, Message: fmt.Sprintf("unsupported type %s", v.Type())}
	}
	if n.Kind != yaml.ScalarNode {
		return &Error{Option: path, Message: "must be " + want}
	}
	// Only a YAML string becomes a string: `secret: 12345` is a mistake,
	// and `true` or `1.0` would not read back as written.
	tag := n.ShortTag()
	ok := false
	switch v.Kind() {
	case reflect.String:
		ok = tag == "!!str"
	case reflect.Bool:
		ok = tag == "!!bool"
	case reflect.Int, reflect.Int64:
		ok = tag == "!!int"
	case reflect.Float64:
		ok = tag == "!!int" || tag == "!!float"
	}
	if !ok {
		return &Error{Option: path, Message: "must be " + want}
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		return &Error{Option: path, Message: "must be " + want + " in range"}
	}
	return nil
}
