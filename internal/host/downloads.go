package host

import (
	"computeplane/internal/config"
	"computeplane/internal/downloads"
)

// downloadSource is the source the downloads route serves, nil when
// downloads are not configured: the directory, the blob store, or both
// (the directory first). A directory that is not there, or a blob store
// without credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), is
// refused at start; opening the store makes no connection.
func downloadSource(cfg *config.Config, getenv func(string) string) (downloads.Source, error) {
	d := cfg.Downloads
	if d == nil {
		return nil, nil
	}
	var srcs downloads.Sources
	if d.Dir != "" {
		src := downloads.DirSource{Dir: d.Dir}
		if err := src.CheckDir(); err != nil {
			return nil, &config.Error{Option: "downloads.dir", Message: err.Error()}
		}
		srcs = append(srcs, src)
	}
	if d.Blob != "" {
		s, err := openBlob("downloads.blob", d.Blob, getenv)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, downloads.BlobSource{Store: s})
	}
	switch len(srcs) {
	case 0:
		return nil, nil
	case 1:
		return srcs[0], nil
	}
	return srcs, nil
}
