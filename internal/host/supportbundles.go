package host

import (
	"os"

	"computeplane/internal/blob"
	"computeplane/internal/config"
	"computeplane/internal/store"
	"computeplane/internal/supportbundles"
)

// supportBundleStore opens the supportBundles option's blob store, nil
// without the option. Its credentials come from the environment (blob's
// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY); missing ones are
// INVALID_CONFIG at start. Opening makes no connection.
func supportBundleStore(cfg *config.Config, getenv func(string) string) (blob.Store, error) {
	if cfg.SupportBundles == nil {
		return nil, nil
	}
	s, err := openBlob("supportBundles.blob", cfg.SupportBundles.Blob, getenv)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// openBlob opens the blob store an option names (its URL, credentials from
// getenv); a problem is INVALID_CONFIG naming the option. Opening makes no
// connection.
func openBlob(option, url string, getenv func(string) string) (*blob.S3, error) {
	bc, err := blob.ParseURL(url)
	if err == nil {
		bc, err = bc.WithEnv(getenv)
	}
	var s *blob.S3
	if err == nil {
		s, err = blob.Open(bc)
	}
	if err != nil {
		return nil, &config.Error{Option: option, Message: err.Error()}
	}
	return s, nil
}

// supportBundlesService is the supportBundles group: it answers
// INVALID_CONFIG without the option.
func supportBundlesService(cfg *config.Config, st *store.Store) (*supportbundles.Service, error) {
	b, err := supportBundleStore(cfg, os.Getenv)
	if err != nil {
		return nil, err
	}
	s := &supportbundles.Service{Store: st, Blob: b}
	if cfg.SupportBundles != nil {
		s.MaxBytes = cfg.SupportBundles.MaxBytes
	}
	return s, nil
}
