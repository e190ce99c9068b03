package host

import (
	"computeplane/internal/config"
	"computeplane/internal/downloads"
)

// downloadSource is the source the downloads route serves, nil when
// downloads are not configured. A directory that is not there is refused
// at start. downloads.blob is refused before this (unbuilt.go) until the
// blob store source exists; it is another downloads.Source.
func downloadSource(cfg *config.Config) (downloads.Source, error) {
	d := cfg.Downloads
	if d == nil || d.Dir == "" {
		return nil, nil
	}
	src := downloads.DirSource{Dir: d.Dir}
	if err := src.CheckDir(); err != nil {
		return nil, &config.Error{Option: "downloads.dir", Message: err.Error()}
	}
	return src, nil
}
